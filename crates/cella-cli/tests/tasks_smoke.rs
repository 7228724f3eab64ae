//! Task runs, end to end on the server's side (as root, real sandboxes, real git), with
//! `command` agents so that no model is needed: the embedded `local` git forge over
//! `DATA_DIR/repos/owner/name`, a repository made here by the test.
//!
//! Cases: an agent that edits and commits (`stopped`, the branch on the remote holds the edit,
//! one compute entry with the run's id); an agent that exits 3 (`failed`, `agent_exit`); a hung
//! agent whose supervisor (`cella __task-agent`) the test freezes with SIGSTOP from the host
//! (`failed`, `heartbeat_lost`); a cancel while running (`cancelled`, the work pushed); a cancel
//! while queued behind `runners = 1` (never starts, costs nothing); retention (after the run and
//! a clean stop, neither the task message's marker nor a file's marker is anywhere under the data
//! directory); the run's sandbox is not in the sandboxes API; the session limit (SIGTERM, grace,
//! SIGKILL; `stopped`, `session_limit`, the partial work pushed); a `kill -9` of the server
//! mid-run (after the restart the run is `failed`, `server_restart`, no sandbox is left, the
//! queued run starts, one charge across two restarts). The full suite with GitHub, GitLab
//! and model stand-ins is `tasks.rs`.

mod common;

use common::{Server, KEY};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const CONFIG: &str = r#"
[tasks]
runners = 1
heartbeat_interval_sec = 1
grace_sec = 2

[gateway]
reserve_per_run = "0.500000"

[[agents]]
name = "edit"
kind = "command"
command = ["bash", "-c", "printf 'FILEMARK_%s\n' \"$CELLA_TASK_ID\" > notes.txt && git add notes.txt && git -c user.name=t -c user.email=t@e commit -qm 'agent edit' && echo edited"]

[[agents]]
name = "fail"
kind = "command"
command = ["bash", "-c", "echo failing; exit 3"]

[[agents]]
name = "hang"
kind = "command"
command = ["bash", "-c", "echo 'partial work' > partial.txt; while true; do echo tick; sleep 1; done"]
"#;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A repository `acme/app` with one commit on `main`, under the server's `DATA_DIR/repos`.
fn make_repo(s: &Server) -> std::path::PathBuf {
    let dir = s.data_dir().join("repos/acme/app");
    std::fs::create_dir_all(&dir).unwrap();
    git(&dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("README.md"), "hello\n").unwrap();
    git(&dir, &["add", "README.md"]);
    git(
        &dir,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@e",
            "commit",
            "-qm",
            "first",
        ],
    );
    dir
}

/// A workspace with task runs enabled, credited, at `rate`; returns (workspace id, key).
fn workspace(s: &Server, rate: &str, heartbeat_timeout_sec: u32) -> (String, String) {
    let (ws, key) = s.workspace_key(
        "developer",
        &["tasks:read", "tasks:write", "sandboxes:read"],
    );
    let r = s.req(
        "PATCH",
        &format!("/api/v1/workspaces/{ws}"),
        Some(KEY),
        Some(&json!({ "settings": {
            "tasks_enabled": true,
            "compute_rate": rate,
            "session_limit_min": 5,
            "heartbeat_timeout_sec": heartbeat_timeout_sec,
        } })),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s.post(
        &format!("/api/v1/workspaces/{ws}/wallet/credits"),
        json!({ "amount": "100.000000", "reference": "test" }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    (ws, key)
}

fn start(s: &Server, key: &str, agent: &str, task: &str) -> Value {
    let r = s.req(
        "POST",
        "/api/v1/tasks",
        Some(key),
        Some(&json!({ "repository": "acme/app", "base_branch": "main", "task": task, "agent": agent })),
    );
    assert_eq!(r.status, 201, "{}\n{}", r.body, s.log());
    r.data().clone()
}

fn get(s: &Server, key: &str, id: &str) -> Value {
    let r = s.req("GET", &format!("/api/v1/tasks/{id}"), Some(key), None);
    assert_eq!(r.status, 200, "{}", r.body);
    r.data().clone()
}

fn wait_state(s: &Server, key: &str, id: &str, states: &[&str], secs: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let t = get(s, key, id);
        if states.iter().any(|st| t["state"] == *st) {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "task {id} stayed {} (wanted {states:?}): {t}\n{}",
            t["state"],
            s.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Host pids of the `cella __task-agent` of run `id` (found by its environment).
fn task_agent_pids(id: &str) -> Vec<i32> {
    let mut out = Vec::new();
    let want = format!("CELLA_TASK_ID={id}");
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        if args.len() < 2 || args[1] != b"__task-agent" {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if env.split(|b| *b == 0).any(|v| v == want.as_bytes()) {
            out.push(pid);
        }
    }
    out
}

fn ledger(s: &Server, ws: &str) -> Vec<Value> {
    let r = s.get(&format!("/api/v1/workspaces/{ws}/ledger?limit=1000"));
    assert_eq!(r.status, 200, "{}", r.body);
    r.data().as_array().unwrap().clone()
}

/// Every file under `dir` that holds `needle`. Only a file's data is read: the holes of a
/// sparse file (the disk pool's images are mostly holes) read as zeros and cannot hold it.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if m.is_dir() {
                stack.push(p);
            } else if m.is_file() && file_holds(&p, needle) {
                hits.push(p.display().to_string());
            }
        }
    }
    hits
}

/// Whether the data extents of the file at `p` hold `needle`, read in 1 MiB chunks that
/// overlap by the needle's length.
fn file_holds(p: &Path, needle: &[u8]) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::fd::AsRawFd;
    let Ok(mut f) = std::fs::File::open(p) else {
        return false;
    };
    let len = f.metadata().map(|m| m.len() as i64).unwrap_or(0);
    let mut at: i64 = 0;
    let mut buf = vec![0u8; 1 << 20];
    while at < len {
        // SAFETY: lseek on a descriptor this function owns.
        let data = unsafe { libc::lseek(f.as_raw_fd(), at, libc::SEEK_DATA) };
        if data < 0 {
            break; // no data past `at`
        }
        let hole = unsafe { libc::lseek(f.as_raw_fd(), data, libc::SEEK_HOLE) };
        let end = if hole < 0 { len } else { hole };
        let mut pos = data;
        while pos < end {
            let want = ((end - pos) as usize).min(buf.len());
            if f.seek(SeekFrom::Start(pos as u64)).is_err() {
                return false;
            }
            let Ok(n) = f.read(&mut buf[..want]) else {
                return false;
            };
            if n == 0 {
                break;
            }
            if buf[..n].windows(needle.len()).any(|w| w == needle) {
                return true;
            }
            if pos + n as i64 >= end {
                break;
            }
            // Step back by the needle's length so a match across chunks is seen.
            pos += (n.saturating_sub(needle.len()).max(1)) as i64;
        }
        at = end;
    }
    false
}

#[test]
fn an_agent_that_edits_and_commits_stops_and_its_branch_holds_the_edit_and_nothing_is_kept() {
    let mut s = Server::start_with(CONFIG);
    let repo = make_repo(&s);
    let (ws, key) = workspace(&s, "0.001000", 60);
    let marker = "TASKMARK_7f3e9a1c";
    let t = start(&s, &key, "edit", &format!("please edit: {marker}"));
    let id = t["id"].as_str().unwrap().to_string();
    assert_eq!(t["state"], "queued");
    assert_eq!(t["branch"], format!("cella/{id}"));
    assert_eq!(t["base_branch"], "main");
    assert_eq!(t["forge"], "local");
    let t = wait_state(&s, &key, &id, &["stopped", "failed", "cancelled"], 180);
    assert_eq!(t["state"], "stopped", "{t}\n{}", s.log());
    assert_eq!(t["stop_reason"], "agent_exit");
    assert!(t["failure_reason"].is_null());
    assert!(
        t["pull_request"].is_null(),
        "a git forge opens no pull request"
    );
    // The branch on the remote holds the agent's commit on top of main.
    let branch = format!("cella/{id}");
    let file = git(&repo, &["show", &format!("{branch}:notes.txt")]);
    assert_eq!(file, format!("FILEMARK_{id}"));
    let base = git(&repo, &["rev-parse", "main"]);
    let parent = git(&repo, &["rev-parse", &format!("{branch}~1")]);
    assert_eq!(parent, base);
    // One compute entry with the run's id, of its cost.
    let entries: Vec<Value> = ledger(&s, &ws)
        .into_iter()
        .filter(|e| e["kind"] == "compute")
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["task_id"], id.as_str());
    assert!(entries[0]["sandbox_id"].is_null());
    assert_eq!(t["compute_cost"], "0.060000", "60 s minimum at 0.001: {t}");
    let w = s.get(&format!("/api/v1/workspaces/{ws}/wallet"));
    assert_eq!(w.data()["reserved"], "0.000000", "{}", w.body);
    // The live log is gone with the run.
    let r = s.req("GET", &format!("/api/v1/tasks/{id}/log"), Some(&key), None);
    r.assert_error(410, "GONE");
    // The events stream of an ended run: its state, then the end.
    let r = s.req(
        "GET",
        &format!("/api/v1/tasks/{id}/events"),
        Some(&key),
        None,
    );
    assert_eq!(r.status, 200);
    let evs = common::sse(r.body.as_str().unwrap_or(""));
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0].0, "state");
    assert_eq!(evs[0].1["state"], "stopped");
    // Retention: after a clean stop, neither marker is anywhere in the data directory (the
    // repository the test made lives there too: it is the remote, and holds the file's marker
    // as the forge would; it is left out).
    let data = s.data_dir();
    let deadline = Instant::now() + Duration::from_secs(60);
    while data.join("tasks").join(&id).exists() {
        assert!(Instant::now() < deadline, "the run's host directory stays");
        std::thread::sleep(Duration::from_millis(50));
    }
    s.stop();
    let msg_hits = files_holding(&data, marker.as_bytes());
    assert!(
        msg_hits.is_empty(),
        "the task message is kept in {msg_hits:?}"
    );
    let file_marker = format!("FILEMARK_{id}");
    let file_hits: Vec<String> = files_holding(&data, file_marker.as_bytes())
        .into_iter()
        .filter(|p| !p.starts_with(&repo.display().to_string()))
        .collect();
    assert!(
        file_hits.is_empty(),
        "repository content is kept in {file_hits:?}"
    );
    let left: Vec<_> = std::fs::read_dir(data.join("sandboxes"))
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "the run's sandbox is left: {left:?}");
}

#[test]
fn a_failing_agent_fails_with_agent_exit_and_a_frozen_supervisor_fails_with_heartbeat_lost() {
    let s = Server::start_with(CONFIG);
    make_repo(&s);
    let (_ws, key) = workspace(&s, "0", 10);
    let t = start(&s, &key, "fail", "fail please");
    let id = t["id"].as_str().unwrap().to_string();
    let t = wait_state(&s, &key, &id, &["stopped", "failed", "cancelled"], 180);
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["stop_reason"], "agent_exit");
    assert_eq!(t["failure_reason"], "agent_exit: exit code 3");

    let t = start(&s, &key, "hang", "hang please");
    let id = t["id"].as_str().unwrap().to_string();
    wait_state(&s, &key, &id, &["running"], 180);
    // The run's sandbox is the server's own: not in the sandboxes API.
    let r = s.req("GET", "/api/v1/sandboxes", Some(&key), None);
    assert_eq!(r.data().as_array().map(|a| a.len()), Some(0), "{}", r.body);
    let deadline = Instant::now() + Duration::from_secs(30);
    let pids = loop {
        let p = task_agent_pids(&id);
        if !p.is_empty() {
            break p;
        }
        assert!(Instant::now() < deadline, "no __task-agent found");
        std::thread::sleep(Duration::from_millis(100));
    };
    for p in &pids {
        unsafe { libc::kill(*p, libc::SIGSTOP) };
    }
    let t = wait_state(&s, &key, &id, &["stopped", "failed", "cancelled"], 60);
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["stop_reason"], "heartbeat_lost");
    assert!(t["failure_reason"]
        .as_str()
        .unwrap_or("")
        .starts_with("heartbeat_lost"));
    for p in &pids {
        unsafe { libc::kill(*p, libc::SIGCONT) };
    }
}

#[test]
fn cancel_while_running_pushes_the_work_and_cancel_while_queued_never_starts() {
    let s = Server::start_with(CONFIG);
    let repo = make_repo(&s);
    let (ws, key) = workspace(&s, "0.001000", 60);
    let a = start(&s, &key, "hang", "first");
    let a_id = a["id"].as_str().unwrap().to_string();
    // runners = 1: the second waits.
    let b = start(&s, &key, "edit", "second");
    let b_id = b["id"].as_str().unwrap().to_string();
    wait_state(&s, &key, &a_id, &["running"], 180);
    assert_eq!(get(&s, &key, &b_id)["state"], "queued");
    let r = s.req(
        "POST",
        &format!("/api/v1/tasks/{b_id}/cancel"),
        Some(&key),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.data()["state"], "cancelled");
    assert_eq!(r.data()["compute_cost"], "0.000000");
    assert!(r.data()["started_at"].is_null());
    // The live log while it runs (it ends with the run), then a cancel.
    let log = std::thread::scope(|sc| {
        let reader = sc.spawn(|| {
            s.req(
                "GET",
                &format!("/api/v1/tasks/{a_id}/log"),
                Some(&key),
                None,
            )
        });
        std::thread::sleep(Duration::from_millis(2500));
        let r = s.req(
            "POST",
            &format!("/api/v1/tasks/{a_id}/cancel"),
            Some(&key),
            None,
        );
        assert_eq!(r.status, 200, "{}", r.body);
        reader.join().unwrap()
    });
    assert_eq!(log.status, 200);
    let events = common::sse(log.body.as_str().unwrap_or(""));
    assert!(
        events.iter().any(|(name, d)| name == "output"
            && d["stream"] == "stdout"
            && d["text"].as_str().unwrap_or("").contains("tick")),
        "{events:?}"
    );
    let t = wait_state(&s, &key, &a_id, &["stopped", "failed", "cancelled"], 120);
    assert_eq!(t["state"], "cancelled", "{t}\n{}", s.log());
    assert_eq!(t["stop_reason"], "cancelled");
    // What the agent did (uncommitted) was committed by Cella and pushed.
    let file = git(&repo, &["show", &format!("cella/{a_id}:partial.txt")]);
    assert_eq!(file, "partial work");
    // Cancel again: the same answer, nothing changes.
    let r = s.req(
        "POST",
        &format!("/api/v1/tasks/{a_id}/cancel"),
        Some(&key),
        None,
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.data()["state"], "cancelled");
    // The queued run never started and left no ledger entry.
    let b = get(&s, &key, &b_id);
    assert_eq!(b["state"], "cancelled");
    let computes: Vec<Value> = ledger(&s, &ws)
        .into_iter()
        .filter(|e| e["kind"] == "compute")
        .collect();
    assert_eq!(computes.len(), 1, "{computes:?}");
    assert_eq!(computes[0]["task_id"], a_id.as_str());
}

#[test]
fn a_kill_9_mid_run_leaves_no_run_running_no_sandbox_and_one_charge_after_the_restart() {
    let mut s = Server::start_with(CONFIG);
    make_repo(&s);
    let (ws, key) = workspace(&s, "0.001000", 60);
    let t = start(&s, &key, "hang", "hang until the server dies");
    let id = t["id"].as_str().unwrap().to_string();
    wait_state(&s, &key, &id, &["running"], 180);
    let queued = start(&s, &key, "fail", "queued behind it");
    let queued_id = queued["id"].as_str().unwrap().to_string();
    assert_eq!(get(&s, &key, &queued_id)["state"], "queued");
    s.restart(); // kill -9, then a new server on the same data directory
    let t = get(&s, &key, &id);
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["stop_reason"], "server_restart");
    assert!(t["failure_reason"]
        .as_str()
        .unwrap_or("")
        .starts_with("server_restart"));
    // The queued run survived the restart and runs now (one slot, so the slot came back).
    let q = wait_state(
        &s,
        &key,
        &queued_id,
        &["stopped", "failed", "cancelled"],
        180,
    );
    assert_eq!(q["failure_reason"], "agent_exit: exit code 3", "{q}");
    // No supervisor of the killed run is left, and no sandbox is left on the host.
    assert!(task_agent_pids(&id).is_empty());
    // (The queued run's own teardown may still be going on just after it ended.)
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left: Vec<String> = std::fs::read_dir(s.data_dir().join("sandboxes"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sandboxes left: {left:?}\n{}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!s.data_dir().join("tasks").join(&id).exists());
    // Charged once; a second restart charges nothing again.
    s.restart();
    let computes: Vec<Value> = ledger(&s, &ws)
        .into_iter()
        .filter(|e| e["kind"] == "compute" && e["task_id"] == id.as_str())
        .collect();
    assert_eq!(computes.len(), 1, "{computes:?}");
    let w = s.get(&format!("/api/v1/workspaces/{ws}/wallet"));
    assert_eq!(w.data()["reserved"], "0.000000", "{}", w.body);
}

#[test]
fn the_session_limit_stops_the_agent_and_pushes_what_it_did() {
    let s = Server::start_with(CONFIG);
    let repo = make_repo(&s);
    let (_ws, key) = workspace(&s, "0", 60);
    let r = s.req(
        "PATCH",
        &format!("/api/v1/workspaces/{_ws}"),
        Some(KEY),
        Some(&json!({ "settings": { "session_limit_min": 1 } })),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let t = start(&s, &key, "hang", "work until stopped");
    let id = t["id"].as_str().unwrap().to_string();
    assert_eq!(t["session_limit_min"], 1);
    let t = wait_state(&s, &key, &id, &["stopped", "failed", "cancelled"], 240);
    assert_eq!(t["state"], "stopped", "{t}");
    assert_eq!(t["stop_reason"], "session_limit");
    assert!(t["failure_reason"].is_null());
    let file = git(&repo, &["show", &format!("cella/{id}:partial.txt")]);
    assert_eq!(file, "partial work");
}
