//! Repository task runs end to end: the real server, real sandboxes, real git, and stand-ins for
//! what this machine cannot reach (GitHub's and GitLab's REST APIs and git servers, and a model
//! provider; see `common/forges.rs` and `common/model.rs`). Each case checks what a user would:
//! the run's state and charges, the draft pull request on the forge and the branch behind it, the
//! token revoked, the ledger, nothing left on the host.
//!
//! Where a model is not the point, the runs use a `command` agent (a bash script), which is
//! faster. One case waits for the session limit (one minute, the smallest): it is marked `slow`
//! in its name; it runs alongside the others (the suite takes about a minute and a half on two
//! cores with the default test threads, the session-limit case being the longest).

mod common;
#[path = "common/forges.rs"]
mod forges;
#[path = "common/model.rs"]
mod model;

use common::{Server, KEY};
use forges::{commits_between, file_on_branch, make_repo, GitHub, GitLab};
use model::{Model, Turn};
use serde_json::{json, Value};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Helpers

/// Decimal string -> micro-units.
fn money(v: &Value) -> i64 {
    let s = v
        .as_str()
        .unwrap_or_else(|| panic!("not a decimal string: {v}"));
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s),
    };
    let (w, f) = body.split_once('.').expect("six decimals");
    assert_eq!(f.len(), 6, "{s}");
    let m = w.parse::<i64>().unwrap() * 1_000_000 + f.parse::<i64>().unwrap();
    if neg {
        -m
    } else {
        m
    }
}

/// A unique marker for this test process.
fn marker(what: &str) -> String {
    let n: u64 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    format!("{what}-{:x}-{}", n, std::process::id())
}

/// The server config for a run's test: the forge(s), the agent(s), the rest.
fn config(runners: u32, forges: &str, agents: &str, extra: &str) -> String {
    format!(
        "[tasks]\nrunners = {runners}\nheartbeat_interval_sec = 1\ngrace_sec = 2\n\n{forges}\n{agents}\n{extra}\n"
    )
}

/// A `git` forge over the bare repositories under `root`.
fn git_forge(name: &str, root: &Path) -> String {
    format!(
        "[[forges]]\nname = \"{name}\"\nkind = \"git\"\nurl_template = \"{}/{{repository}}.git\"\n",
        root.display()
    )
}

/// A `command` agent running `script` with bash in the checkout.
fn command_agent(name: &str, script: &str) -> String {
    format!("[[agents]]\nname = \"{name}\"\nkind = \"command\"\ncommand = [\"bash\", \"-c\", '''{script}''']\n")
}

const GIT_ID: &str = "git -c user.name=agent -c user.email=agent@example.org";

/// A workspace with task runs enabled, `rate` per second, `credit` in its wallet, and a key
/// with the task scopes. Returns (workspace id, key).
fn workspace(s: &Server, rate: &str, credit: &str, session_limit_min: u32) -> (String, String) {
    let (ws, key) = s.workspace_key("developer", &["tasks:read", "tasks:write"]);
    set_settings(s, &ws, true, rate, session_limit_min);
    if credit != "0" {
        let r = s.post(
            &format!("/api/v1/workspaces/{ws}/wallet/credits"),
            json!({ "amount": credit, "reference": "test credit" }),
        );
        assert_eq!(r.status, 201, "{}", r.body);
    }
    (ws, key)
}

fn set_settings(s: &Server, ws: &str, enabled: bool, rate: &str, session_limit_min: u32) {
    let r = s.req(
        "PATCH",
        &format!("/api/v1/workspaces/{ws}"),
        Some(KEY),
        Some(&json!({ "settings": {
            "tasks_enabled": enabled, "compute_rate": rate,
            "session_limit_min": session_limit_min, "heartbeat_timeout_sec": 60
        } })),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

fn start(s: &Server, key: &str, body: Value) -> Value {
    let r = s.req("POST", "/api/v1/tasks", Some(key), Some(&body));
    assert_eq!(r.status, 201, "start: {}\n{}", r.body, tail(s));
    assert_eq!(r.data()["state"], "queued", "{}", r.body);
    r.data().clone()
}

fn get(s: &Server, key: &str, id: &str) -> Value {
    let r = s.req("GET", &format!("/api/v1/tasks/{id}"), Some(key), None);
    assert_eq!(r.status, 200, "{}", r.body);
    r.data().clone()
}

fn list(s: &Server, key: &str, query: &str) -> Vec<Value> {
    let r = s.req("GET", &format!("/api/v1/tasks{query}"), Some(key), None);
    assert_eq!(r.status, 200, "{}", r.body);
    r.data().as_array().unwrap().clone()
}

fn cancel(s: &Server, key: &str, id: &str) -> Value {
    let r = s.req(
        "POST",
        &format!("/api/v1/tasks/{id}/cancel"),
        Some(key),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.data().clone()
}

/// The last lines of the server's log, for a failing assertion.
fn tail(s: &Server) -> String {
    let log = s.log();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Waits until the run satisfies `pred`; returns it.
fn wait_for(s: &Server, key: &str, id: &str, secs: u64, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let t = get(s, key, id);
        if pred(&t) {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "run {id} did not get there in {secs} s: {t}\n{}",
            tail(s)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn is_terminal(t: &Value) -> bool {
    matches!(
        t["state"].as_str(),
        Some("stopped" | "failed" | "cancelled")
    )
}

fn wait_end(s: &Server, key: &str, id: &str, secs: u64) -> Value {
    wait_for(s, key, id, secs, is_terminal)
}

fn wait_state(s: &Server, key: &str, id: &str, state: &str, secs: u64) -> Value {
    wait_for(s, key, id, secs, |t| t["state"] == state || is_terminal(t))
}

fn ledger(s: &Server, ws: &str) -> Vec<Value> {
    let r = s.get(&format!("/api/v1/workspaces/{ws}/ledger?limit=1000"));
    assert_eq!(r.status, 200, "{}", r.body);
    r.data().as_array().unwrap().clone()
}

/// The workspace's ledger once `task` has its `compute` entry (settling ends teardown, a
/// moment after the run's terminal state is written); the ledger as it is after 15 s otherwise.
fn settled_ledger(s: &Server, ws: &str, task: &str) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let entries = ledger(s, ws);
        if !entries_of(&entries, task, "compute").is_empty() || Instant::now() > deadline {
            return entries;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn entries_of<'a>(entries: &'a [Value], task: &str, kind: &str) -> Vec<&'a Value> {
    entries
        .iter()
        .filter(|e| e["task_id"] == task && e["kind"] == kind)
        .collect()
}

/// Follows `GET /api/v1/tasks/{id}/events` in a thread: every (when it arrived, event, data).
fn follow_events(
    s: &Server,
    key: &str,
    id: &str,
) -> std::thread::JoinHandle<Vec<(Instant, String, Value)>> {
    let url = format!("{}/api/v1/tasks/{id}/events", s.url);
    let key = key.to_string();
    std::thread::spawn(move || {
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .unwrap();
        let res = http.get(url).bearer_auth(key).send().unwrap();
        assert_eq!(res.status().as_u16(), 200, "events");
        read_sse(res)
    })
}

/// Reads an SSE body line by line, timing each event as it arrives.
fn read_sse(res: reqwest::blocking::Response) -> Vec<(Instant, String, Value)> {
    let mut out = Vec::new();
    let mut name = String::new();
    let mut data = String::new();
    for line in std::io::BufReader::new(res).lines() {
        let Ok(line) = line else { break };
        if let Some(v) = line.strip_prefix("event:") {
            name = v.trim().to_string();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
        } else if line.is_empty() && !data.is_empty() {
            let v: Value = serde_json::from_str(&data).unwrap_or(Value::String(data.clone()));
            out.push((Instant::now(), std::mem::take(&mut name), v));
            data.clear();
        }
    }
    out
}

fn states(events: &[(Instant, String, Value)]) -> Vec<String> {
    events
        .iter()
        .filter(|(_, n, _)| n == "state")
        .map(|(_, _, d)| d["state"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// The server's time (`at`, RFC 3339 UTC) of the run's first `state` event of `state`, in
/// milliseconds since the epoch.
fn at_ms(events: &[(Instant, String, Value)], state: &str) -> i64 {
    let at = events
        .iter()
        .find(|(_, n, d)| n == "state" && d["state"] == state)
        .and_then(|(_, _, d)| d["at"].as_str())
        .unwrap_or_else(|| panic!("no {state} event: {events:?}"));
    rfc3339_ms(at).unwrap_or_else(|| panic!("not an RFC 3339 UTC time: {at}"))
}

fn rfc3339_ms(s: &str) -> Option<i64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let d: Vec<i64> = date
        .split('-')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let t: Vec<i64> = hms
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let ms: i64 = format!("{frac:0<3}")[..3].parse().ok()?;
    // Days since the epoch (civil from days, inverted).
    let (y, m) = if d[1] <= 2 {
        (d[0] - 1, d[1] + 9)
    } else {
        (d[0], d[1] - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d[2] - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + t[0]) * 60 + t[1]) * 60_000 + t[2] * 1000 + ms)
}

/// Every sandbox (cgroup) the server's instance has on the host right now.
fn instance_sandboxes(s: &Server) -> Vec<String> {
    let Ok(instance) = std::fs::read_to_string(s.data_dir().join("instance-id")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let roots: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    for root in roots.into_iter().chain([PathBuf::from("/sys/fs/cgroup")]) {
        if let Ok(rd) = std::fs::read_dir(root.join("cella").join(instance.trim())) {
            for e in rd.flatten() {
                if e.path().is_dir() {
                    out.push(e.file_name().to_string_lossy().to_string());
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Waits (a little) for the server's sandboxes to be gone; asserts none is left.
fn assert_no_sandbox_left(s: &Server) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left = instance_sandboxes(s);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "sandboxes left on the host: {left:?}\n{}",
            tail(s)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Asserts the run's host checkout is gone (teardown ends with it, a moment after the run's
/// terminal state is written).
fn assert_no_host_checkout(s: &Server, id: &str) {
    let dir = s.data_dir().join("tasks").join(id);
    let deadline = Instant::now() + Duration::from_secs(15);
    while dir.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!dir.exists(), "{} still exists", dir.display());
}

/// Files under `dir` (recursively) whose bytes contain `needle`: `grep -rlaF`, as a user
/// would look (fast on the data directory's large disk images, where a scan here is slow).
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let out = Command::new("grep")
        .args(["-r", "-l", "-a", "-F", "--no-messages", "-e", needle])
        .arg(dir)
        .output()
        .expect("grep");
    // 0: found, 1: not found, 2: an error (an unreadable file is skipped, not an error here).
    assert!(out.status.code() != Some(2) || !out.stdout.is_empty() || dir.exists());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The built-in agent on the GitHub stand-in

/// The built-in agent, driven by the model stand-in, on a repository of the GitHub stand-in:
/// it lists and reads files, edits one (committing with the model's message), runs the
/// repository's tests and finishes. The run ends `stopped`; a draft PR is opened whose head
/// branch holds the edit; the body reports compute time and costs but not the agent's output;
/// the installation token is revoked; the task and the ledger carry the compute and model costs.
#[test]
fn builtin_agent_on_github_opens_a_draft_pr_with_the_edit_and_bills_it() {
    let tests_marker = marker("TESTS-PASSED");
    let gh = GitHub::start();
    let bare = gh.repo(
        "acme/web",
        &[
            ("README.md", "# web\n"),
            ("greeting.txt", "hello, world\n"),
            (
                "test.sh",
                &format!(
                    "#!/bin/sh\nif grep -q 'hello, tasks' greeting.txt; then echo '{tests_marker}'; else echo 'TESTS FAILED'; exit 1; fi\n"
                ),
            ),
        ],
    );
    let m = Model::start(vec![
        Turn::Tool("list_files", json!({ "path": "." })),
        Turn::Tool("read_file", json!({ "path": "greeting.txt" })),
        Turn::Tool(
            "edit_file",
            json!({ "path": "greeting.txt", "old": "hello, world", "new": "hello, tasks",
                    "commit_message": "Greet the tasks" }),
        ),
        Turn::Tool(
            "run_command",
            json!({ "command": "sh test.sh", "timeout_sec": 60 }),
        ),
        Turn::Tool(
            "finish",
            json!({ "summary": "The greeting now greets the tasks." }),
        ),
    ]);
    let s = Server::start_with(&config(2, &gh.forge_toml("github"), "", &m.gateway_toml()));
    let (ws, key) = workspace(&s, "0.001000", "50", 5);
    let t = start(
        &s,
        &key,
        json!({ "repository": "acme/web", "task": "Make the greeting greet the tasks." }),
    );
    let id = t["id"].as_str().unwrap().to_string();
    assert_eq!(t["base_branch"], "main", "the repository's default branch");
    assert_eq!(t["forge"], "github");
    assert_eq!(t["agent"], "builtin");
    assert_eq!(t["branch"], format!("cella/{id}"));
    let t = wait_end(&s, &key, &id, 180);
    assert_eq!(t["state"], "stopped", "{t}\n{}", tail(&s));
    assert_eq!(t["stop_reason"], "agent_exit", "{t}");
    assert!(t["failure_reason"].is_null(), "{t}");
    let branch = t["branch"].as_str().unwrap().to_string();

    // The model stand-in saw the upstream key (never the run's token), the model, the tools.
    let reqs = m.requests();
    assert!(reqs.len() >= 5, "{} model requests", reqs.len());
    for r in &reqs {
        assert_eq!(
            r.authorization.as_deref(),
            Some(format!("Bearer {}", model::UPSTREAM_KEY).as_str())
        );
        assert_eq!(r.model, model::MODEL);
        for tool in [
            "list_files",
            "read_file",
            "write_file",
            "edit_file",
            "run_command",
            "finish",
        ] {
            assert!(r.tools.iter().any(|n| n == tool), "tools {:?}", r.tools);
        }
    }
    // The agent gave the model the file it read and the tests' output.
    let said = |i: usize| reqs[i].body["messages"].to_string();
    assert!(said(2).contains("hello, world"), "{}", said(2));
    assert!(said(4).contains(&tests_marker), "{}", said(4));

    // The token is revoked at teardown, a moment after the run's terminal state.
    let deadline = Instant::now() + Duration::from_secs(15);
    while gh.log().minted.iter().any(|m| !m.revoked) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    // The draft PR, against main, from the run's branch, which holds the edit.
    let log = gh.log();
    assert!(log.violations.is_empty(), "{:?}", log.violations);
    assert_eq!(log.pulls.len(), 1, "{:?}", log.pulls);
    let pr = &log.pulls[0];
    assert!(pr.draft);
    assert_eq!(pr.head, branch);
    assert_eq!(pr.base, "main");
    assert!(!pr.user_agent.is_empty());
    assert_eq!(
        t["pull_request"],
        json!({ "number": pr.number, "url": format!("http://127.0.0.1:{}/acme/web/pull/{}", gh.port, pr.number), "draft": true }),
        "{t}"
    );
    assert_eq!(
        file_on_branch(&bare, &branch, "greeting.txt").as_deref(),
        Some("hello, tasks\n")
    );
    assert!(
        commits_between(&bare, "main", &branch)
            .iter()
            .any(|c| c == "Greet the tasks"),
        "{:?}",
        commits_between(&bare, "main", &branch)
    );
    assert_eq!(
        file_on_branch(&bare, "main", "greeting.txt").as_deref(),
        Some("hello, world\n"),
        "main is untouched"
    );
    // The body: compute time and costs; never the agent's output or a credential.
    assert!(
        pr.body.contains(t["compute_cost"].as_str().unwrap()),
        "{}",
        pr.body
    );
    assert!(
        pr.body.contains(t["model_cost"].as_str().unwrap()),
        "{}",
        pr.body
    );
    // A compute time: a number of seconds (`42s`, `1m 5s`, `42 s`).
    let b = pr.body.as_bytes();
    let has_seconds = (1..b.len()).any(|i| {
        b[i] == b's'
            && (b[i - 1].is_ascii_digit()
                || (i > 1 && b[i - 1] == b' ' && b[i - 2].is_ascii_digit()))
    });
    assert!(
        has_seconds && pr.body.to_lowercase().contains("compute"),
        "no compute time in {}",
        pr.body
    );
    assert!(!pr.body.contains(&tests_marker), "{}", pr.body);
    assert!(!pr.body.contains(model::UPSTREAM_KEY));
    // One token, for this one repository, used for git and revoked at teardown.
    assert!(!log.minted.is_empty());
    for tok in &log.minted {
        assert_eq!(tok.repository, "acme/web");
        assert!(tok.revoked, "a token was not revoked");
        assert!(!pr.body.contains(&tok.token));
    }
    assert!(
        log.git
            .iter()
            .any(|(_, what, _)| what == "git-receive-pack"),
        "no push: {:?}",
        log.git.iter().map(|g| &g.1).collect::<Vec<_>>()
    );
    drop(log);

    // Charges: on the task and in the ledger, with the task's id.
    let rate = money(&t["compute_rate"]);
    assert_eq!(rate, 1000);
    let sec = t["compute_sec"].as_i64().unwrap();
    assert_eq!(money(&t["compute_cost"]), sec.max(60) * rate, "{t}");
    let per_request = (model::PROMPT_TOKENS + 2 * model::COMPLETION_TOKENS) as i64;
    assert_eq!(t["model_requests"].as_i64().unwrap(), reqs.len() as i64);
    assert_eq!(money(&t["model_cost"]), per_request * reqs.len() as i64);
    let entries = settled_ledger(&s, &ws, &id);
    let compute = entries_of(&entries, &id, "compute");
    assert_eq!(compute.len(), 1, "{entries:?}");
    assert_eq!(money(&compute[0]["amount"]), -money(&t["compute_cost"]));
    let models = entries_of(&entries, &id, "model");
    assert_eq!(models.len(), reqs.len(), "{entries:?}");
    assert_eq!(
        models.iter().map(|e| money(&e["amount"])).sum::<i64>(),
        -money(&t["model_cost"])
    );
    // The message is not kept; the sandbox and the checkout are gone.
    assert!(t.get("task").is_none_or(|v| v.is_null()), "{t}");
    assert_no_sandbox_left(&s);
    assert_no_host_checkout(&s, &id);
    // The internal sandbox never showed in the sandboxes API.
    let r = s.req("GET", "/api/v1/sandboxes", Some(&key), None);
    if r.status == 200 {
        assert_eq!(r.data().as_array().map(|a| a.len()), Some(0), "{}", r.body);
    }
}

/// The built-in agent with no `[[gateway.upstreams]]` is refused at once (400 naming the
/// missing section), never queued.
#[test]
fn builtin_agent_without_an_upstream_is_400_naming_the_missing_section() {
    let repos = tempfile::tempdir().unwrap();
    make_repo(repos.path(), "acme/web", &[("README.md", "# web\n")]);
    let s = Server::start_with(&config(2, &git_forge("git", repos.path()), "", ""));
    let (_ws, key) = workspace(&s, "0", "10", 5);
    let r = s.req(
        "POST",
        "/api/v1/tasks",
        Some(&key),
        Some(&json!({ "repository": "acme/web", "task": "anything" })),
    );
    r.assert_error(400, "INVALID_REQUEST");
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("[[gateway.upstreams]]"),
        "{}",
        r.body
    );
    assert!(list(&s, &key, "").is_empty());
}

// ---------------------------------------------------------------------------------------------
// Refusals that queue nothing

/// Wallet too low (402), tasks disabled (403 tasks_disabled), an unknown repository and a
/// missing base branch (404), bad bodies (400 naming the field): each changes nothing.
#[test]
fn refused_starts_queue_nothing() {
    let repos = tempfile::tempdir().unwrap();
    make_repo(repos.path(), "acme/web", &[("README.md", "# web\n")]);
    let s = Server::start_with(&config(
        2,
        &git_forge("git", repos.path()),
        &command_agent("script", "true"),
        "",
    ));
    let body = json!({ "repository": "acme/web", "task": "anything" });

    // Tasks disabled (the default).
    let (ws_off, key_off) = s.workspace_key("developer", &["tasks:read", "tasks:write"]);
    let r = s.req("POST", "/api/v1/tasks", Some(&key_off), Some(&body));
    r.assert_error(403, "FORBIDDEN");
    assert_eq!(
        r.body["error"]["details"]["reason"], "tasks_disabled",
        "{}",
        r.body
    );
    assert!(list(&s, &key_off, "").is_empty());

    // The wallet cannot cover session_limit_min x 60 x rate (+ the run's model reserve).
    set_settings(&s, &ws_off, true, "0.010000", 60);
    let r = s.post(
        &format!("/api/v1/workspaces/{ws_off}/wallet/credits"),
        json!({ "amount": "1.000000", "reference": "too little" }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let r = s.req("POST", "/api/v1/tasks", Some(&key_off), Some(&body));
    r.assert_error(402, "INSUFFICIENT_FUNDS");
    assert!(list(&s, &key_off, "").is_empty());
    let w = s.get(&format!("/api/v1/workspaces/{ws_off}/wallet"));
    assert_eq!(w.data()["reserved"], "0.000000", "{}", w.body);
    assert!(
        s.get(&format!("/api/v1/workspaces/{ws_off}/ledger"))
            .data()
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["kind"] == "credit"),
        "only the credit"
    );

    let (_ws, key) = workspace(&s, "0", "10", 5);
    // An unknown repository, a missing base branch: 404.
    s.req(
        "POST",
        "/api/v1/tasks",
        Some(&key),
        Some(&json!({ "repository": "acme/nothere", "task": "x" })),
    )
    .assert_error(404, "NOT_FOUND");
    s.req(
        "POST",
        "/api/v1/tasks",
        Some(&key),
        Some(&json!({ "repository": "acme/web", "base_branch": "nope", "task": "x" })),
    )
    .assert_error(404, "NOT_FOUND");
    // Bad bodies: 400 naming the field.
    for (b, field) in [
        (json!({ "repository": "acme/web", "task": "" }), "task"),
        (
            json!({ "repository": "../../etc", "task": "x" }),
            "repository",
        ),
        (
            json!({ "repository": "acme/web", "task": "x", "extra": 1 }),
            "extra",
        ),
        (
            json!({ "repository": "acme/web", "task": "x", "forge": "nope" }),
            "forge",
        ),
        (
            json!({ "repository": "acme/web", "task": "x", "agent": "nope" }),
            "agent",
        ),
        (
            json!({ "repository": "acme/web", "task": "x".repeat(65_537) }),
            "task",
        ),
    ] {
        let r = s.req("POST", "/api/v1/tasks", Some(&key), Some(&b));
        r.assert_error(400, "INVALID_REQUEST");
        assert!(
            r.body["error"].to_string().contains(field),
            "{field}: {}",
            r.body
        );
    }
    assert!(list(&s, &key, "").is_empty());
    // Another workspace's run, and an unknown id, are 404.
    s.req("GET", "/api/v1/tasks/tsknothere", Some(&key), None)
        .assert_error(404, "NOT_FOUND");
    // A key with only tasks:read cannot start one.
    let (_, ro) = s.workspace_key("developer", &["tasks:read"]);
    s.req("POST", "/api/v1/tasks", Some(&ro), Some(&body))
        .assert_error(403, "FORBIDDEN");
}

// ---------------------------------------------------------------------------------------------
// Command agents on a plain git forge

/// An agent that fails ends `failed` with `agent_exit` and the exit code; what it committed is
/// still pushed (the branch is the handoff on a plain git forge: no pull request).
#[test]
fn an_agent_that_fails_ends_failed_agent_exit() {
    let repos = tempfile::tempdir().unwrap();
    let bare = make_repo(repos.path(), "acme/web", &[("README.md", "# web\n")]);
    let script = format!(
        "echo partial > partial.txt && {GIT_ID} add -A && {GIT_ID} commit -qm 'Partial work' && echo about to fail && exit 3"
    );
    let s = Server::start_with(&config(
        2,
        &git_forge("git", repos.path()),
        &command_agent("script", &script),
        "",
    ));
    let (ws, key) = workspace(&s, "0.001000", "20", 5);
    let t = start(
        &s,
        &key,
        json!({ "repository": "acme/web", "task": "fail" }),
    );
    let id = t["id"].as_str().unwrap().to_string();
    let t = wait_end(&s, &key, &id, 120);
    assert_eq!(t["state"], "failed", "{t}\n{}", tail(&s));
    assert_eq!(t["stop_reason"], "agent_exit", "{t}");
    let reason = t["failure_reason"].as_str().unwrap();
    assert!(reason.starts_with("agent_exit"), "{reason}");
    assert!(reason.contains('3'), "{reason}");
    assert!(reason.len() <= 500 && !reason.contains('\n'));
    assert!(t["pull_request"].is_null(), "a git forge opens no PR: {t}");
    let branch = t["branch"].as_str().unwrap();
    assert_eq!(
        file_on_branch(&bare, branch, "partial.txt").as_deref(),
        Some("partial\n")
    );
    // Billed once, with the 60-second minimum.
    let entries = settled_ledger(&s, &ws, &id);
    let c = entries_of(&entries, &id, "compute");
    assert_eq!(c.len(), 1, "{entries:?}");
    assert!(money(&t["compute_cost"]) >= 60 * 1000, "{t}");
    assert_no_sandbox_left(&s);
    assert_no_host_checkout(&s, &id);
}

/// A workspace's `task_runtime` setting puts its runs' sandboxes on gVisor: the agent runs under
/// gVisor's kernel (what it saw is on the pushed branch), reads the base read-only, and the run
/// ends, bills and cleans up as on the namespace runtime. A runtime the server does not know is
/// a 400 naming the setting, and changes nothing.
#[test]
fn task_runtime_gvisor_runs_the_agent_under_gvisor() {
    if !common::have_runsc() {
        return;
    }
    let repos = tempfile::tempdir().unwrap();
    let bare = make_repo(repos.path(), "acme/web", &[("README.md", "# web\n")]);
    let script = format!(
        "uname -r > kernel.txt; cp README.md seen.txt; \
         if touch /opt/cella-base/x 2>/dev/null; then echo writable > base.txt; fi; \
         {GIT_ID} add -A && {GIT_ID} commit -qm 'What the agent saw'"
    );
    let s = Server::start_with(&config(
        2,
        &git_forge("git", repos.path()),
        &command_agent("script", &script),
        "",
    ));
    let (ws, key) = workspace(&s, "0.001000", "20", 5);
    let patch = |settings: Value| {
        s.req(
            "PATCH",
            &format!("/api/v1/workspaces/{ws}"),
            Some(KEY),
            Some(&json!({ "settings": settings })),
        )
    };
    let bad = patch(json!({ "task_runtime": "firecracker" }));
    bad.assert_error(400, "INVALID_REQUEST");
    assert_eq!(
        bad.body["error"]["details"]["field"],
        "settings.task_runtime"
    );
    let now = s.get(&format!("/api/v1/workspaces/{ws}"));
    assert!(
        now.data()["settings"].get("task_runtime").is_none(),
        "{}",
        now.body
    );
    let ok = patch(json!({ "task_runtime": "gvisor" }));
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.data()["settings"]["task_runtime"], "gvisor");

    let t = start(
        &s,
        &key,
        json!({ "repository": "acme/web", "task": "look around" }),
    );
    let id = t["id"].as_str().unwrap().to_string();
    let t = wait_end(&s, &key, &id, 180);
    assert_eq!(t["state"], "stopped", "{t}\n{}", tail(&s));
    let branch = t["branch"].as_str().unwrap();
    // gVisor's kernel answers `uname -r` with its own release, not the host's.
    let host = String::from_utf8(Command::new("uname").arg("-r").output().unwrap().stdout).unwrap();
    let seen = file_on_branch(&bare, branch, "kernel.txt").unwrap();
    assert_ne!(seen, host, "the agent ran on the host's kernel");
    assert_eq!(
        file_on_branch(&bare, branch, "seen.txt").as_deref(),
        Some("# web\n")
    );
    assert_eq!(
        file_on_branch(&bare, branch, "base.txt"),
        None,
        "the base is read-only"
    );
    let entries = settled_ledger(&s, &ws, &id);
    assert_eq!(entries_of(&entries, &id, "compute").len(), 1, "{entries:?}");
    assert_no_sandbox_left(&s);
    assert_no_host_checkout(&s, &id);
    assert!(
        !s.log().contains("the sandbox did not start"),
        "{}",
        tail(&s)
    );
}

/// Kept base checkouts (`[tasks] checkout_cache`, "local" by default for a forge on this
/// host): the second run on the same base commit skips the clone and its agent works on the
/// same files; once the base branch moves, the next run is on the new commit (never a stale
/// kept one). The agent sees the base's objects read-only at `/opt/cella-base` and cannot
/// write there. With the cache off, nothing is kept.
#[test]
fn a_run_on_a_base_an_earlier_run_cloned_skips_the_clone_and_a_moved_base_is_fresh() {
    let repos = tempfile::tempdir().unwrap();
    let bare = make_repo(repos.path(), "acme/web", &[("README.md", "# web\n")]);
    let script = format!(
        "cp README.md seen.txt; if touch /opt/cella-base/x 2>/dev/null; then echo writable > base.txt; fi; \
         {GIT_ID} add -A && {GIT_ID} commit -qm 'What the agent saw'"
    );
    let s = Server::start_with(&config(
        2,
        &git_forge("git", repos.path()),
        &command_agent("script", &script),
        "",
    ));
    let (_ws, key) = workspace(&s, "0", "10", 5);
    let run = |task: &str| -> Value {
        let t = start(&s, &key, json!({ "repository": "acme/web", "task": task }));
        let t = wait_end(&s, &key, t["id"].as_str().unwrap(), 120);
        assert_eq!(t["state"], "stopped", "{t}\n{}", tail(&s));
        t
    };
    let checkout_line = |id: &str| -> String {
        s.log()
            .lines()
            .find(|l| l.contains("task run running") && l.contains(id))
            .unwrap_or_else(|| panic!("no running line for {id}\n{}", tail(&s)))
            .to_string()
    };
    let main = forges::git(&bare, &["rev-parse", "main"])
        .trim()
        .to_string();
    let first = run("first");
    let second = run("second");
    for t in [&first, &second] {
        let branch = t["branch"].as_str().unwrap();
        assert_eq!(
            file_on_branch(&bare, branch, "seen.txt").as_deref(),
            Some("# web\n")
        );
        assert_eq!(
            file_on_branch(&bare, branch, "base.txt"),
            None,
            "the base is read-only"
        );
        assert_eq!(
            commits_between(&bare, "main", branch),
            ["What the agent saw"]
        );
    }
    assert!(
        checkout_line(first["id"].as_str().unwrap()).contains("cloned"),
        "{}",
        tail(&s)
    );
    assert!(
        checkout_line(second["id"].as_str().unwrap()).contains("kept"),
        "{}",
        tail(&s)
    );
    let kept: Vec<String> = std::fs::read_dir(s.data_dir().join("checkouts"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        kept.iter().any(|n| n.starts_with(&format!("{main}-"))),
        "{kept:?}"
    );

    // The base moves on the forge: the next run works on the new commit.
    let work = tempfile::tempdir().unwrap();
    forges::git(work.path(), &["clone", "-q", bare.to_str().unwrap(), "w"]);
    let w = work.path().join("w");
    std::fs::write(w.join("README.md"), "# web, moved\n").unwrap();
    forges::git(&w, &["commit", "-q", "-am", "move main"]);
    forges::git(&w, &["push", "-q", "origin", "main"]);
    let third = run("third");
    let branch = third["branch"].as_str().unwrap();
    assert_eq!(
        file_on_branch(&bare, branch, "seen.txt").as_deref(),
        Some("# web, moved\n")
    );
    assert!(checkout_line(third["id"].as_str().unwrap()).contains("cloned"));
    for t in [&first, &second, &third] {
        assert_no_host_checkout(&s, t["id"].as_str().unwrap());
    }
    assert_no_sandbox_left(&s);

    // Off: every run clones and nothing is kept.
    let s = Server::start_with(
        &config(
            2,
            &git_forge("git", repos.path()),
            &command_agent("script", &script),
            "",
        )
        .replace("[tasks]\n", "[tasks]\ncheckout_cache = \"off\"\n"),
    );
    let (_ws, key) = workspace(&s, "0", "10", 5);
    let t = start(&s, &key, json!({ "repository": "acme/web", "task": "off" }));
    let t = wait_end(&s, &key, t["id"].as_str().unwrap(), 120);
    assert_eq!(t["state"], "stopped", "{t}\n{}", tail(&s));
    assert_eq!(
        file_on_branch(&bare, t["branch"].as_str().unwrap(), "seen.txt").as_deref(),
        Some("# web, moved\n")
    );
    assert!(!s.data_dir().join("checkouts").exists());
}

/// An agent that hands back a branch larger than `[tasks] max_repo_bytes` (2 MB of random
/// bytes committed, a bundle that does not compress; the cap 400 kB): the server refuses the
/// bundle from the size the sandbox reports, before reading it (and would stop streaming at
/// the first chunk past the cap), so it never holds it; the run fails `bad_handoff` naming the
/// cap, nothing is pushed, and no sandbox or host directory is left.
#[test]
fn a_bundle_past_max_repo_bytes_is_refused_without_being_read_and_nothing_is_pushed() {
    let repos = tempfile::tempdir().unwrap();
    let bare = make_repo(repos.path(), "acme/web", &[("README.md", "# web\n")]);
    let script = format!(
        "head -c 2000000 /dev/urandom > big.bin && {GIT_ID} add big.bin && {GIT_ID} commit -qm 'A big file'"
    );
    let s = Server::start_with(&format!(
        "[tasks]\nrunners = 2\nheartbeat_interval_sec = 1\ngrace_sec = 2\nmax_repo_bytes = 400000\n\n{}\n{}\n",
        git_forge("git", repos.path()),
        command_agent("big", &script)
    ));
    let (_ws, key) = workspace(&s, "0", "10", 5);
    let t = start(&s, &key, json!({ "repository": "acme/web", "task": "big" }));
    let id = t["id"].as_str().unwrap().to_string();
    let t = wait_end(&s, &key, &id, 120);
    assert_eq!(t["state"], "failed", "{t}\n{}", tail(&s));
    let reason = t["failure_reason"].as_str().unwrap_or("");
    assert!(reason.starts_with("bad_handoff"), "{reason}");
    assert!(
        reason.contains("larger than 400000 bytes") && reason.contains("max_repo_bytes"),
        "{reason}"
    );
    let branch = t["branch"].as_str().unwrap();
    assert!(
        file_on_branch(&bare, branch, "big.bin").is_none(),
        "nothing of the refused bundle was pushed"
    );
    assert_no_sandbox_left(&s);
    assert_no_host_checkout(&s, &id);
}

/// slow (about 70 s): the session limit (1 minute, the smallest) stops an agent that keeps
/// working: SIGTERM, the grace period, SIGKILL; its uncommitted work is committed by Cella and
/// pushed; the run is `stopped` with `stop_reason: session_limit` and no failure reason.
#[test]
fn slow_session_limit_stops_the_agent_and_pushes_its_partial_work() {
    let repos = tempfile::tempdir().unwrap();
    let bare = make_repo(repos.path(), "acme/web", &[("README.md", "# web\n")]);
    // Ignores SIGTERM: only SIGKILL ends it. Never commits.
    let script = "trap '' TERM; while true; do date >> work.log; sleep 1; done";
    let s = Server::start_with(&config(
        2,
        &git_forge("git", repos.path()),
        &command_agent("busy", script),
        "",
    ));
    let (ws, key) = workspace(&s, "0.001000", "20", 1);
    let t = start(
        &s,
        &key,
        json!({ "repository": "acme/web", "task": "work forever" }),
    );
    let id = t["id"].as_str().unwrap().to_string();
    assert_eq!(t["session_limit_min"], 1);
    let t = wait_end(&s, &key, &id, 150);
    assert_eq!(t["state"], "stopped", "{t}\n{}", tail(&s));
    assert_eq!(t["stop_reason"], "session_limit", "{t}");
    assert!(t["failure_reason"].is_null(), "{t}");
    let branch = t["branch"].as_str().unwrap();
    let work = file_on_branch(&bare, branch, "work.log").expect("the partial work was pushed");
    assert!(work.lines().count() >= 10, "{work}");
    assert!(!commits_between(&bare, "main", branch).is_empty());
    // Billed for about a minute (at least the minimum), once.
    assert!(t["compute_sec"].as_i64().unwrap() >= 60, "{t}");
    assert_eq!(
        entries_of(&settled_ledger(&s, &ws, &id), &id, "compute").len(),
        1
    );
    assert_no_sandbox_left(&s);
}

/// Cancel in each state, with `runners = 1`: a queued run never starts and costs nothing; a
/// running one has its agent stopped and its work pushed, `cancelled`; one cancelled while it
/// is provisioning leaves no sandbox. Cancel is idempotent and leaves an ended run as it is.
#[test]
fn cancel_while_queued_provisioning_and_running() {
    let repos = tempfile::tempdir().unwrap();
    let bare = make_repo(repos.path(), "acme/web", &[("README.md", "# web\n")]);
    let script = format!(
        "echo one > one.txt && {GIT_ID} add -A && {GIT_ID} commit -qm 'First step' && echo two > two.txt && sleep 600"
    );
    let s = Server::start_with(&config(
        1,
        &git_forge("git", repos.path()),
        &command_agent("slow", &script),
        "",
    ));
    let (ws, key) = workspace(&s, "0.001000", "50", 5);
    let a = start(&s, &key, json!({ "repository": "acme/web", "task": "a" }));
    let a_id = a["id"].as_str().unwrap().to_string();
    let b = start(&s, &key, json!({ "repository": "acme/web", "task": "b" }));
    let b_id = b["id"].as_str().unwrap().to_string();
    wait_state(&s, &key, &a_id, "running", 120);
    // The one runner is busy: b waits.
    assert_eq!(get(&s, &key, &b_id)["state"], "queued");
    // Cancel while queued: at once, never starts, nothing charged.
    let c = cancel(&s, &key, &b_id);
    assert_eq!(c["state"], "cancelled", "{c}");
    assert_eq!(c["stop_reason"], "cancelled", "{c}");
    assert!(c["started_at"].is_null(), "{c}");
    assert_eq!(c["compute_cost"], "0.000000");
    let again = cancel(&s, &key, &b_id);
    assert_eq!(again["state"], "cancelled");
    assert_eq!(again["ended_at"], c["ended_at"], "idempotent");

    // Cancel while running: the agent stopped, its work (committed and not) pushed.
    // Wait until it has committed its first step.
    let deadline = Instant::now() + Duration::from_secs(30);
    std::thread::sleep(Duration::from_secs(2));
    assert!(Instant::now() < deadline);
    let r = cancel(&s, &key, &a_id);
    assert!(
        ["running", "cancelled"].contains(&r["state"].as_str().unwrap()),
        "{r}"
    );
    let a = wait_end(&s, &key, &a_id, 60);
    assert_eq!(a["state"], "cancelled", "{a}\n{}", tail(&s));
    assert_eq!(a["stop_reason"], "cancelled", "{a}");
    let branch = a["branch"].as_str().unwrap();
    assert_eq!(
        file_on_branch(&bare, branch, "one.txt").as_deref(),
        Some("one\n")
    );
    assert_eq!(
        file_on_branch(&bare, branch, "two.txt").as_deref(),
        Some("two\n"),
        "the uncommitted change was committed and pushed"
    );
    // b stayed cancelled and never ran; the ledger has a's compute entry only.
    let b = get(&s, &key, &b_id);
    assert_eq!(b["state"], "cancelled");
    assert!(b["started_at"].is_null());
    let entries = settled_ledger(&s, &ws, &a_id);
    assert_eq!(entries_of(&entries, &a_id, "compute").len(), 1);
    assert!(entries_of(&entries, &b_id, "compute").is_empty());
    assert_no_sandbox_left(&s);

    // Cancel while provisioning: cancel as soon as the events say `provisioning`.
    let c = start(&s, &key, json!({ "repository": "acme/web", "task": "c" }));
    let c_id = c["id"].as_str().unwrap().to_string();
    let url = format!("{}/api/v1/tasks/{c_id}/events", s.url);
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let res = http.get(url).bearer_auth(&key).send().unwrap();
    let mut seen = None;
    let mut lines = std::io::BufReader::new(res).lines();
    while let Some(Ok(line)) = lines.next() {
        if line.contains("\"provisioning\"") || line.contains("\"running\"") {
            let r = cancel(&s, &key, &c_id);
            let at = if line.contains("\"provisioning\"") {
                "provisioning"
            } else {
                "running"
            };
            seen = Some(format!("{at} (the cancel answered {})", r["state"]));
            break;
        }
    }
    let seen = seen.expect("the run never provisioned");
    eprintln!("cancel landed while the run was {seen}");
    let c = wait_end(&s, &key, &c_id, 60);
    assert_eq!(c["state"], "cancelled", "{c}\n{}", tail(&s));
    assert_no_sandbox_left(&s);
    assert_no_host_checkout(&s, &c_id);
    // On an ended run cancel is 200 with the run unchanged.
    let again = cancel(&s, &key, &c_id);
    assert_eq!(again, get(&s, &key, &c_id));
}

/// `runners = 1` and three runs queued: they start in the order they were queued, one at a time
/// (each starts only after the one before has ended), as their event streams show.
#[test]
fn one_runner_runs_three_queued_runs_in_order_one_at_a_time() {
    let repos = tempfile::tempdir().unwrap();
    make_repo(repos.path(), "acme/web", &[("README.md", "# web\n")]);
    let script = format!(
        "sleep 2 && echo \"$CELLA_TASK_ID\" > ran.txt && {GIT_ID} add -A && {GIT_ID} commit -qm ran"
    );
    let s = Server::start_with(&config(
        1,
        &git_forge("git", repos.path()),
        &command_agent("short", &script),
        "",
    ));
    let (_ws, key) = workspace(&s, "0", "10", 5);
    let ids: Vec<String> = (0..3)
        .map(|i| {
            let t = start(
                &s,
                &key,
                json!({ "repository": "acme/web", "task": format!("run {i}") }),
            );
            t["id"].as_str().unwrap().to_string()
        })
        .collect();
    let followers: Vec<_> = ids.iter().map(|id| follow_events(&s, &key, id)).collect();
    // While the first runs, the others wait.
    wait_state(&s, &key, &ids[0], "running", 120);
    assert_eq!(get(&s, &key, &ids[1])["state"], "queued");
    assert_eq!(get(&s, &key, &ids[2])["state"], "queued");
    let events: Vec<Vec<(Instant, String, Value)>> =
        followers.into_iter().map(|f| f.join().unwrap()).collect();
    for (i, (id, ev)) in ids.iter().zip(&events).enumerate() {
        let st = states(ev);
        // The first may have started before its stream opened; the others were waiting.
        assert_eq!(
            st.first().map(String::as_str),
            Some(if i == 0 { st[0].as_str() } else { "queued" }),
            "{id}: {st:?}"
        );
        assert_eq!(
            st.last().map(String::as_str),
            Some("stopped"),
            "{id}: {st:?}\n{}",
            tail(&s)
        );
        assert!(st.contains(&"running".to_string()), "{id}: {st:?}");
    }
    // By the server's clock (each event's `at`): a run is taken only after the one before it
    // has ended (the streams are separate connections, so their arrival order says nothing).
    for i in 1..3 {
        let prev_end = at_ms(&events[i - 1], "stopped");
        let start = at_ms(&events[i], "provisioning");
        assert!(
            start >= prev_end,
            "run {i} started ({start} ms) before run {} ended ({prev_end} ms): {:?} {:?}",
            i - 1,
            events[i - 1],
            events[i]
        );
    }
    // And the list, newest first, shows all three stopped.
    let l = list(&s, &key, "?state=stopped");
    let listed: Vec<&str> = l.iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(listed, vec![&ids[2][..], &ids[1][..], &ids[0][..]]);
    // Paging with a cursor walks the same list.
    let page = s.req("GET", "/api/v1/tasks?limit=2", Some(&key), None);
    assert_eq!(page.data().as_array().unwrap().len(), 2);
    let cursor = page.body["next_cursor"].as_str().expect("a next cursor");
    let rest = list(&s, &key, &format!("?limit=2&cursor={cursor}"));
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0]["id"], ids[0]);
    assert!(list(&s, &key, "?repository=acme/other").is_empty());
    assert_eq!(list(&s, &key, "?repository=acme/web").len(), 3);
}

/// A run on the GitLab stand-in: cloned and pushed with `oauth2:<token>`, a draft merge request
/// (`Draft:` title) from the run's branch to the base.
#[test]
fn gitlab_run_opens_a_draft_merge_request() {
    let gl = GitLab::start();
    let bare = gl.repo("group/sub/app", &[("README.md", "# app\n")]);
    let script = format!("echo 'more docs' >> README.md && {GIT_ID} commit -qam 'Document more'");
    let s = Server::start_with(&config(
        2,
        &gl.forge_toml("gitlab"),
        &command_agent("script", &script),
        "",
    ));
    let (_ws, key) = workspace(&s, "0", "10", 5);
    let t = start(
        &s,
        &key,
        json!({ "repository": "group/sub/app", "base_branch": "main", "task": "docs" }),
    );
    let id = t["id"].as_str().unwrap().to_string();
    let t = wait_end(&s, &key, &id, 120);
    assert_eq!(t["state"], "stopped", "{t}\n{}", tail(&s));
    let log = gl.log();
    assert!(log.violations.is_empty(), "{:?}", log.violations);
    assert_eq!(log.merge_requests.len(), 1);
    let mr = &log.merge_requests[0];
    assert!(mr.title.starts_with("Draft:"), "{}", mr.title);
    assert_eq!(mr.source_branch, t["branch"].as_str().unwrap());
    assert_eq!(mr.target_branch, "main");
    assert_eq!(mr.project, "group/sub/app");
    assert_eq!(t["pull_request"]["number"], mr.iid);
    assert_eq!(t["pull_request"]["draft"], true);
    assert_eq!(
        t["pull_request"]["url"],
        format!(
            "http://127.0.0.1:{}/group/sub/app/-/merge_requests/{}",
            gl.port, mr.iid
        )
    );
    assert!(log.git.iter().any(|(_, w)| w == "git-receive-pack"));
    drop(log);
    assert!(
        file_on_branch(&bare, t["branch"].as_str().unwrap(), "README.md")
            .unwrap()
            .contains("more docs")
    );
    assert_no_sandbox_left(&s);
}

/// `kill -9` of the server mid-run: after the restart no run is left `running` (it is `failed`,
/// `server_restart`), its sandbox is gone, a queued run survives and starts (the slot was not
/// lost), and the run is charged once, across a second restart too.
#[test]
fn kill9_mid_run_fails_it_server_restart_without_leaks_or_double_charges() {
    let repos = tempfile::tempdir().unwrap();
    make_repo(repos.path(), "acme/web", &[("README.md", "# web\n")]);
    let script = "sleep 600";
    let mut s = Server::start_with(&config(
        1,
        &git_forge("git", repos.path()),
        &command_agent("hang", script),
        "",
    ));
    let (ws, key) = workspace(&s, "0.001000", "50", 5);
    let a = start(&s, &key, json!({ "repository": "acme/web", "task": "a" }));
    let a_id = a["id"].as_str().unwrap().to_string();
    let b = start(&s, &key, json!({ "repository": "acme/web", "task": "b" }));
    let b_id = b["id"].as_str().unwrap().to_string();
    wait_state(&s, &key, &a_id, "running", 120);
    assert_eq!(get(&s, &key, &b_id)["state"], "queued");
    s.restart();
    let a = wait_end(&s, &key, &a_id, 60);
    assert_eq!(a["state"], "failed", "{a}\n{}", tail(&s));
    assert!(
        a["failure_reason"]
            .as_str()
            .unwrap()
            .starts_with("server_restart"),
        "{a}"
    );
    assert_eq!(a["stop_reason"], "server_restart");
    // The queued run survived and gets the runner.
    wait_state(&s, &key, &b_id, "running", 120);
    assert!(list(&s, &key, "?state=running")
        .iter()
        .all(|t| t["id"] == b_id));
    cancel(&s, &key, &b_id);
    wait_end(&s, &key, &b_id, 60);
    assert_no_sandbox_left(&s);
    assert_no_host_checkout(&s, &a_id);
    let before = entries_of(&settled_ledger(&s, &ws, &a_id), &a_id, "compute").len();
    assert_eq!(before, 1, "a is charged once");
    let w = s.get(&format!("/api/v1/workspaces/{ws}/wallet"));
    assert_eq!(w.data()["reserved"], "0.000000", "{}", w.body);
    // A second restart charges nothing again.
    s.restart();
    let entries = ledger(&s, &ws);
    assert_eq!(entries_of(&entries, &a_id, "compute").len(), 1);
    assert_eq!(entries_of(&entries, &b_id, "compute").len(), 1);
    assert!(list(&s, &key, "")
        .iter()
        .all(|t| t["state"] != "running" && t["state"] != "provisioning"));
}

/// A repository and an agent that try to run code on the host through git: tracked hook
/// scripts, a `.gitattributes` filter, and (written by the agent) `.git/config` with
/// `core.fsmonitor`, `core.hooksPath` and filter drivers plus `.git/hooks/*`, all running a
/// marker command. The server's own git never runs them: no marker appears on the host.
#[test]
fn repository_and_agent_cannot_run_code_in_the_host_side_git() {
    let host_marker = std::env::temp_dir().join(marker("cella-host-git-marker"));
    let m = host_marker.display().to_string();
    let repos = tempfile::tempdir().unwrap();
    let evil = format!("#!/bin/sh\ntouch {m}\n");
    let bare = make_repo(
        repos.path(),
        "acme/web",
        &[
            ("README.md", "# web\n"),
            (".gitattributes", "* filter=evil diff=evil merge=evil\n"),
            ("hooks/post-checkout", &evil),
            ("hooks/pre-push", &evil),
            (".githooks/post-checkout", &evil),
        ],
    );
    // The forge's own repository points its hooks at the tracked ones too (a server that used
    // the repository's config would run them).
    let script = format!(
        r#"cat >> .git/config <<'EOF'
[core]
	fsmonitor = "touch {m}; false"
	hooksPath = hooks
[filter "evil"]
	clean = "touch {m}; cat"
	smudge = "touch {m}; cat"
[diff "evil"]
	textconv = "touch {m}; cat"
[merge "evil"]
	driver = "touch {m}; true"
[uploadpack]
	packObjectsHook = "touch {m};"
EOF
for h in pre-commit post-commit pre-push post-checkout reference-transaction pre-receive post-receive update post-update fsmonitor-watchman; do
  printf '#!/bin/sh\ntouch {m}\n' > .git/hooks/$h; chmod +x .git/hooks/$h
done
echo change >> README.md
echo attr > attr.txt
git -c user.name=a -c user.email=a@b add -A 2>/dev/null
git -c user.name=a -c user.email=a@b -c core.fsmonitor=false -c core.hooksPath=/dev/null commit -qm 'Evil config' || true
echo uncommitted > later.txt
rm -f {m}
"#
    );
    let s = Server::start_with(&config(
        2,
        &git_forge("git", repos.path()),
        &command_agent("evil", &script),
        "",
    ));
    let (_ws, key) = workspace(&s, "0", "10", 5);
    let t = start(
        &s,
        &key,
        json!({ "repository": "acme/web", "task": "attack" }),
    );
    let id = t["id"].as_str().unwrap().to_string();
    let t = wait_end(&s, &key, &id, 120);
    eprintln!("the attack run ended: {t}");
    assert!(
        !host_marker.exists(),
        "the host ran code from the repository or the agent's git config: {}",
        host_marker.display()
    );
    // The run hands its branch over (a bundle, verified, fetched into the host's bare clone and
    // pushed, without the sandbox's config, hooks or attributes), or is refused as a bad
    // handoff; either way the agent's files are plain files on the branch. (A `filter.*.process`
    // the agent configures breaks its own sandbox's final commit: bad_handoff; left out here so
    // the host's side of the handoff runs.)
    if t["state"] == "stopped" {
        let branch = t["branch"].as_str().unwrap();
        assert!(file_on_branch(&bare, branch, "later.txt").is_some());
        assert!(
            file_on_branch(&bare, branch, ".git/config").is_none(),
            "a .git directory was committed"
        );
    } else {
        assert!(
            t["failure_reason"]
                .as_str()
                .unwrap_or("")
                .starts_with("bad_handoff"),
            "{t}"
        );
    }
    assert!(!host_marker.exists());
    assert_no_host_checkout(&s, &id);
    assert_no_sandbox_left(&s);
}

/// Retention: a task message and file contents with unique markers (and the agent's output);
/// after the run ends and the server has stopped cleanly, no file under the data directory (nor
/// the server's log) holds any of them. The store keeps the run's fields.
#[test]
fn nothing_of_the_message_files_or_output_is_kept_after_a_clean_stop() {
    let msg = marker("TASK-MESSAGE-MARKER");
    let content = marker("FILE-CONTENT-MARKER");
    let output = marker("AGENT-OUTPUT-MARKER");
    let repos = tempfile::tempdir().unwrap();
    let bare = make_repo(repos.path(), "acme/web", &[("README.md", "# web\n")]);
    // The config (and so any log of it) holds each marker only in two halves: the whole marker
    // exists only in the run.
    let (c1, c2) = content.split_at(8);
    let (o1, o2) = output.split_at(8);
    let script = format!(
        "A='{o1}'; B='{o2}'; echo \"$A$B\"; cat /task/TASK.md > /dev/null; echo \"$CELLA_TASK\" | grep -q TASK-MESSAGE && C='{c1}' && D='{c2}' && echo \"$C$D\" > secret.txt && {GIT_ID} add -A && {GIT_ID} commit -qm 'Add the file'"
    );
    let mut s = Server::start_with(&config(
        2,
        &git_forge("git", repos.path()),
        &command_agent("script", &script),
        "",
    ));
    let (_ws, key) = workspace(&s, "0", "10", 5);
    let t = start(
        &s,
        &key,
        json!({ "repository": "acme/web", "task": format!("Please: {msg}") }),
    );
    let id = t["id"].as_str().unwrap().to_string();
    let t = wait_end(&s, &key, &id, 120);
    assert_eq!(t["state"], "stopped", "{t}\n{}", tail(&s));
    // The work did reach the forge (so the markers really went through the run).
    assert_eq!(
        file_on_branch(&bare, t["branch"].as_str().unwrap(), "secret.txt")
            .map(|c| c.trim().to_string()),
        Some(content.clone())
    );
    assert_no_host_checkout(&s, &id);
    assert_no_sandbox_left(&s);
    s.stop();
    // The search itself finds what is there.
    let control = marker("CONTROL-MARKER");
    std::fs::write(s.data_dir().join("control.txt"), &control).unwrap();
    assert_eq!(files_containing(&s.data_dir(), &control).len(), 1);
    for needle in [&msg, &content, &output] {
        let hits = files_containing(&s.data_dir(), needle);
        assert!(hits.is_empty(), "{needle} found in {hits:?}");
        assert!(
            !s.log().contains(needle.as_str()),
            "{needle} in the server's log"
        );
    }
}

/// The live log: the agent's output streams (`event: output`, stdout and stderr) while the run
/// is alive; once it has ended the log answers 410 `GONE` (it was never kept).
#[test]
fn live_log_streams_while_running_and_is_gone_after() {
    let repos = tempfile::tempdir().unwrap();
    make_repo(repos.path(), "acme/web", &[("README.md", "# web\n")]);
    let script =
        "sleep 3; echo LOG-LINE-ONE; echo LOG-ERR-LINE >&2; sleep 2; echo LOG-LINE-TWO; sleep 1";
    let s = Server::start_with(&config(
        2,
        &git_forge("git", repos.path()),
        &command_agent("talk", script),
        "",
    ));
    let (_ws, key) = workspace(&s, "0", "10", 5);
    let t = start(
        &s,
        &key,
        json!({ "repository": "acme/web", "task": "talk" }),
    );
    let id = t["id"].as_str().unwrap().to_string();
    wait_state(&s, &key, &id, "running", 120);
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let res = http
        .get(format!("{}/api/v1/tasks/{id}/log", s.url))
        .bearer_auth(&key)
        .send()
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert!(res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .starts_with("text/event-stream"));
    let ev = read_sse(res);
    let outs: Vec<&Value> = ev
        .iter()
        .filter(|(_, n, _)| n == "output")
        .map(|(_, _, d)| d)
        .collect();
    let text = |stream: &str| {
        outs.iter()
            .filter(|d| d["stream"] == stream)
            .map(|d| d["text"].as_str().unwrap_or(""))
            .collect::<String>()
    };
    assert!(text("stdout").contains("LOG-LINE-ONE"), "{outs:?}");
    assert!(text("stdout").contains("LOG-LINE-TWO"), "{outs:?}");
    assert!(text("stderr").contains("LOG-ERR-LINE"), "{outs:?}");
    let t = wait_end(&s, &key, &id, 60);
    assert_eq!(t["state"], "stopped", "{t}");
    s.req("GET", &format!("/api/v1/tasks/{id}/log"), Some(&key), None)
        .assert_error(410, "GONE");
    // The events stream of an ended run: its state, then the end.
    let r = s.req(
        "GET",
        &format!("/api/v1/tasks/{id}/events"),
        Some(&key),
        None,
    );
    assert_eq!(r.status, 200);
    let ev = common::sse(r.body.as_str().unwrap_or(""));
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0].0, "state");
    assert_eq!(ev[0].1["state"], "stopped");
}

/// The live log of a run still queued (`runners = 1`, another run holding the slot) waits for
/// it on the run's own state events: once the run starts, its output streams, and the stream
/// ends cleanly (to its end, no error) when the run ends. A log opened on a queued run that is
/// cancelled before it starts ends cleanly with no event.
#[test]
fn live_log_opened_while_queued_streams_once_it_runs_and_ends_cleanly() {
    let repos = tempfile::tempdir().unwrap();
    make_repo(repos.path(), "acme/web", &[("README.md", "# web\n")]);
    let script = "echo \"QUEUED-LOG-$CELLA_TASK\"; sleep 6";
    let s = Server::start_with(&config(
        1,
        &git_forge("git", repos.path()),
        &command_agent("talk", script),
        "",
    ));
    let (_ws, key) = workspace(&s, "0", "10", 5);
    let first = start(
        &s,
        &key,
        json!({ "repository": "acme/web", "task": "first" }),
    );
    let first = first["id"].as_str().unwrap().to_string();
    wait_state(&s, &key, &first, "running", 120);
    let second = start(
        &s,
        &key,
        json!({ "repository": "acme/web", "task": "second" }),
    );
    let second = second["id"].as_str().unwrap().to_string();
    let third = start(
        &s,
        &key,
        json!({ "repository": "acme/web", "task": "third" }),
    );
    let third = third["id"].as_str().unwrap().to_string();
    // Reads every line of a log stream: (the output events' texts, whether it ended cleanly).
    let open = |id: &str| {
        let url = format!("{}/api/v1/tasks/{id}/log", s.url);
        let key = key.clone();
        let res = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .unwrap()
            .get(url)
            .bearer_auth(key)
            .send()
            .unwrap();
        assert_eq!(res.status().as_u16(), 200, "log");
        std::thread::spawn(move || {
            let mut texts = Vec::new();
            for line in std::io::BufReader::new(res).lines() {
                match line {
                    Ok(l) => {
                        if let Some(d) = l.strip_prefix("data:") {
                            let v: Value = serde_json::from_str(d.trim()).unwrap();
                            texts.push(v["text"].as_str().unwrap_or("").to_string());
                        }
                    }
                    Err(e) => return (texts, Err(e.to_string())),
                }
            }
            (texts, Ok(()))
        })
    };
    let log2 = open(&second);
    let log3 = open(&third);
    // Both were opened while queued (the first run still holds the only slot).
    assert_eq!(get(&s, &key, &second)["state"], "queued");
    assert_eq!(get(&s, &key, &third)["state"], "queued");
    cancel(&s, &key, &third);
    let (texts3, end3) = log3.join().unwrap();
    assert_eq!(end3, Ok(()), "the cancelled run's log ends cleanly");
    assert!(texts3.is_empty(), "{texts3:?}");
    let (texts2, end2) = log2.join().unwrap();
    assert_eq!(end2, Ok(()), "the log ends cleanly when the run ends");
    let all = texts2.concat();
    assert!(all.contains("QUEUED-LOG-second"), "{texts2:?}");
    let t = wait_end(&s, &key, &second, 60);
    assert_eq!(t["state"], "stopped", "{t}");
    assert!(
        !all.contains("QUEUED-LOG-first"),
        "only its own run's output: {texts2:?}"
    );
    s.req(
        "GET",
        &format!("/api/v1/tasks/{second}/log"),
        Some(&key),
        None,
    )
    .assert_error(410, "GONE");
}

// ---------------------------------------------------------------------------------------------
// The CLI

fn cella(s: &Server, key: &str, args: &[&str]) -> std::process::Output {
    Command::new(common::bin())
        .args(args)
        .env("CELLA_SERVER", &s.url)
        .env("CELLA_API_KEY", key)
        .output()
        .unwrap()
}

/// `cella task start --follow` through the real binary: it shows the state changes and the
/// live log and exits 0 when the run is `stopped`; `cella task list --json`, `get --json` and
/// `cancel` show the run; `cella task watch` stopped with Ctrl-C leaves the run going and says so.
#[test]
fn cli_starts_follows_lists_gets_and_watches_runs() {
    let repos = tempfile::tempdir().unwrap();
    make_repo(repos.path(), "acme/web", &[("README.md", "# web\n")]);
    let out_marker = marker("CLI-LOG");
    let script = format!(
        "echo {out_marker}; if [ \"$CELLA_TASK\" = hang ]; then sleep 600; fi; echo x >> README.md; {GIT_ID} commit -qam 'From the CLI'"
    );
    let s = Server::start_with(&config(
        2,
        &git_forge("git", repos.path()),
        &command_agent("script", &script),
        "",
    ));
    let (_ws, key) = workspace(&s, "0", "10", 5);
    let out = cella(
        &s,
        &key,
        &[
            "task", "start", "--repo", "acme/web", "--base", "main", "--task", "edit", "--follow",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}\n{}", tail(&s));
    assert!(
        stdout.contains(&out_marker),
        "the live log: {stdout}\n{stderr}"
    );
    for st in ["queued", "running", "stopped"] {
        assert!(stderr.contains(st), "{st} not shown: {stderr}");
    }
    let listed = cella(&s, &key, &["task", "list", "--json"]);
    assert!(listed.status.success());
    let v: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let arr = v.as_array().unwrap();
    assert_eq!(arr.len(), 1, "{v}");
    assert_eq!(arr[0]["state"], "stopped");
    assert_eq!(arr[0]["repository"], "acme/web");
    let id = arr[0]["id"].as_str().unwrap().to_string();
    let table = cella(&s, &key, &["task", "list"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.starts_with("ID"), "{table}");
    assert!(table.contains(&id) && table.contains("stopped"), "{table}");
    let one = cella(&s, &key, &["task", "get", &id, "--json"]);
    let v: Value = serde_json::from_slice(&one.stdout).unwrap();
    assert_eq!(v["id"], id);
    assert_eq!(v["state"], "stopped");
    let c = cella(&s, &key, &["task", "cancel", &id]);
    assert!(c.status.success());
    assert!(String::from_utf8_lossy(&c.stdout).contains("already ended"));
    let filtered = cella(&s, &key, &["task", "list", "--state", "running", "--json"]);
    assert_eq!(
        serde_json::from_slice::<Value>(&filtered.stdout).unwrap(),
        json!([])
    );
    // A refused start: the API's error, exit 1.
    let bad = cella(
        &s,
        &key,
        &["task", "start", "--repo", "acme/nothere", "--task", "x"],
    );
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("NOT_FOUND"));

    // `watch` and Ctrl-C: following stops, the run goes on.
    let t = start(
        &s,
        &key,
        json!({ "repository": "acme/web", "task": "hang" }),
    );
    let hang = t["id"].as_str().unwrap().to_string();
    let child = Command::new(common::bin())
        .args(["task", "watch", &hang])
        .env("CELLA_SERVER", &s.url)
        .env("CELLA_API_KEY", &key)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_state(&s, &key, &hang, "running", 120);
    std::thread::sleep(Duration::from_secs(2));
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("goes on"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&out_marker));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(get(&s, &key, &hang)["state"], "running");
    let c = cella(&s, &key, &["task", "cancel", &hang]);
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    assert_eq!(wait_end(&s, &key, &hang, 60)["state"], "cancelled");
}

// ---------------------------------------------------------------------------------------------
// The stand-ins themselves

/// An App JWT signed with `key` (RS256, by `openssl dgst -sign`), as the server must make one.
fn app_jwt(key: &Path, app_id: u64, exp_in: i64) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let input = format!(
        "{}.{}",
        b64.encode(br#"{"alg":"RS256","typ":"JWT"}"#),
        b64.encode(json!({ "iat": now - 60, "exp": now + exp_in, "iss": app_id }).to_string())
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in"), &input).unwrap();
    let out = Command::new("openssl")
        .args(["dgst", "-sha256", "-sign"])
        .arg(key)
        .arg(dir.path().join("in"))
        .output()
        .unwrap();
    assert!(out.status.success());
    format!("{input}.{}", b64.encode(out.stdout))
}

/// The stand-ins check what the real services check (so a failure of the cases above is the
/// server's, not theirs): the App JWT's signature, the token's one repository, revocation,
/// git basic auth, `User-Agent`, the draft flag; the model stand-in wants the upstream key.
#[test]
fn standins_check_requests_as_the_real_services_do() {
    use base64::Engine;
    let gh = GitHub::start();
    let bare = gh.repo("acme/web", &[("README.md", "# web\n")]);
    gh.repo("acme/other", &[("README.md", "# other\n")]);
    let http = reqwest::blocking::Client::new();
    let api = gh.api_url();
    let ua = ("user-agent", "cella-test");
    // No JWT, a JWT signed by another key, an expired-too-far one: 401.
    let r = http
        .get(format!("{api}/repos/acme/web/installation"))
        .header(ua.0, ua.1)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let other = tempfile::tempdir().unwrap();
    let other_key = other.path().join("k.pem");
    assert!(Command::new("openssl")
        .args(["genrsa", "-out"])
        .arg(&other_key)
        .arg("2048")
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success());
    let app_id = gh.inner.app_id;
    for bad in [
        app_jwt(&other_key, app_id, 540),
        app_jwt(&gh.private_key_file, app_id + 1, 540),
        app_jwt(&gh.private_key_file, app_id, 3600),
    ] {
        let r = http
            .get(format!("{api}/repos/acme/web/installation"))
            .header(ua.0, ua.1)
            .bearer_auth(bad)
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 401);
    }
    let jwt = app_jwt(&gh.private_key_file, app_id, 540);
    // No User-Agent: 403.
    let r = http
        .get(format!("{api}/repos/acme/web/installation"))
        .bearer_auth(&jwt)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let inst: Value = http
        .get(format!("{api}/repos/acme/web/installation"))
        .header(ua.0, ua.1)
        .bearer_auth(&jwt)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let inst_id = inst["id"].as_u64().unwrap();
    // A token for every repository, or with every permission: refused.
    for body in [
        json!({ "permissions": { "contents": "write" } }),
        json!({ "repositories": ["web"] }),
        json!({ "repositories": ["web"], "permissions": { "contents": "write", "administration": "write" } }),
    ] {
        let r = http
            .post(format!("{api}/app/installations/{inst_id}/access_tokens"))
            .header(ua.0, ua.1)
            .bearer_auth(&jwt)
            .json(&body)
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 422, "{body}");
    }
    let tok: Value = http
        .post(format!("{api}/app/installations/{inst_id}/access_tokens"))
        .header(ua.0, ua.1)
        .bearer_auth(&jwt)
        .json(&json!({ "repositories": ["web"], "permissions": { "contents": "write", "pull_requests": "write" } }))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let token = tok["token"].as_str().unwrap().to_string();
    assert!(token.starts_with("ghs_") && token.len() > 500 && token.matches('.').count() == 2);
    let repo: Value = http
        .get(format!("{api}/repos/acme/web"))
        .header(ua.0, ua.1)
        .bearer_auth(&token)
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(repo["default_branch"], "main");
    let clone_url = repo["clone_url"].as_str().unwrap().to_string();
    // The token is for acme/web only.
    let r = http
        .get(format!("{api}/repos/acme/other"))
        .header(ua.0, ua.1)
        .bearer_auth(&token)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    // Git over smart HTTP with x-access-token:<token>: clone, commit, push a branch.
    let auth = format!(
        "http.extraHeader=Authorization: Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{token}"))
    );
    let work = tempfile::tempdir().unwrap();
    let w = work.path().join("w");
    forges::git(
        work.path(),
        &["-c", &auth, "clone", "-q", &clone_url, w.to_str().unwrap()],
    );
    std::fs::write(w.join("new.txt"), "new\n").unwrap();
    forges::git(&w, &["add", "-A"]);
    forges::git(&w, &["commit", "-qm", "New file"]);
    forges::git(
        &w,
        &[
            "-c",
            &auth,
            "push",
            "-q",
            "origin",
            "HEAD:refs/heads/feature",
        ],
    );
    assert_eq!(
        file_on_branch(&bare, "feature", "new.txt").as_deref(),
        Some("new\n")
    );
    // Without the credential, git is refused.
    assert!(forges::git_try(work.path(), &["ls-remote", &clone_url]).is_none());
    // The draft PR.
    let r = http
        .post(format!("{api}/repos/acme/web/pulls"))
        .header(ua.0, ua.1)
        .bearer_auth(&token)
        .json(
            &json!({ "title": "T", "body": "B", "head": "feature", "base": "main", "draft": true }),
        )
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let pr: Value = r.json().unwrap();
    assert_eq!(pr["draft"], true);
    assert_eq!(pr["head"]["ref"], "feature");
    // Revoked: the token stops working at once, for the API and for git.
    let r = http
        .delete(format!("{api}/installation/token"))
        .header(ua.0, ua.1)
        .bearer_auth(&token)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    assert!(forges::git_try(work.path(), &["-c", &auth, "ls-remote", &clone_url]).is_none());
    {
        let log = gh.log();
        assert_eq!(log.pulls.len(), 1);
        assert!(log.minted.iter().all(|m| m.revoked));
        // Every refusal above was recorded.
        assert!(log.violations.len() >= 8, "{:?}", log.violations);
    }

    // GitLab: PRIVATE-TOKEN for the API, oauth2:<token> for git.
    let gl = GitLab::start();
    gl.repo("group/sub/app", &[("README.md", "# app\n")]);
    let url = format!("{}/api/v4/projects/group%2Fsub%2Fapp", gl.url());
    assert_eq!(http.get(&url).send().unwrap().status().as_u16(), 401);
    let p: Value = http
        .get(&url)
        .header("private-token", &gl.inner.token)
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(p["default_branch"], "main");
    let gl_auth = format!(
        "http.extraHeader=Authorization: Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("oauth2:{}", gl.inner.token))
    );
    let url_to_repo = p["http_url_to_repo"].as_str().unwrap();
    assert!(forges::git_try(work.path(), &["-c", &gl_auth, "ls-remote", url_to_repo]).is_some());
    assert!(forges::git_try(work.path(), &["ls-remote", url_to_repo]).is_none());

    // The model stand-in: the upstream key, then the scripted turns in order.
    let m = Model::start(vec![Turn::Tool("read_file", json!({ "path": "a" }))]);
    let chat = format!("http://127.0.0.1:{}/v1/chat/completions", m.port);
    let body = json!({ "model": model::MODEL, "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {}}}] });
    assert_eq!(
        http.post(&chat)
            .json(&body)
            .send()
            .unwrap()
            .status()
            .as_u16(),
        401
    );
    let v: Value = http
        .post(&chat)
        .bearer_auth(model::UPSTREAM_KEY)
        .json(&body)
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "read_file"
    );
    assert_eq!(v["usage"]["prompt_tokens"], model::PROMPT_TOKENS);
    let reqs = m.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[1].tools, vec!["read_file".to_string()]);
}

#[test]
fn rfc3339_times_read_as_milliseconds() {
    assert_eq!(rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(rfc3339_ms("1970-01-02T00:00:01.5Z"), Some(86_401_500));
    assert_eq!(
        rfc3339_ms("2026-12-01T19:34:39.594Z"),
        Some(1_796_153_679_594)
    );
    assert_eq!(rfc3339_ms("not a time"), None);
}
