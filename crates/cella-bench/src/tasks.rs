//! Task runs: from `queued` to `running` on an idle server with a 10 MB repository on the
//! embedded local forge (the run's sandbox booted, the base branch cloned on the host or its
//! kept checkout linked, its objects shown to the sandbox and checked out there, the agent
//! started), both for runs on a base commit an earlier run kept and for runs whose base moved
//! (a clone each), and how long after the workspace's
//! `heartbeat_timeout_sec` a run whose in-sandbox side froze is failed.
//!
//! The agents are commands (no model is involved): `sleep` waits to be cancelled; `freeze`
//! stops its own supervisor (the process that sends the heartbeats) with SIGSTOP, as a hung
//! agent's side would look from the server.

use crate::{ms, Server, KEY};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The agents the bench's server is configured with.
pub const CONFIG: &str = r#"
[tasks]
runners = 2

[[agents]]
name = "sleep"
kind = "command"
command = ["sleep", "600"]

[[agents]]
name = "freeze"
kind = "command"
command = ["sh", "-c", "kill -STOP $PPID; sleep 600"]
"#;

/// The workspace's heartbeat timeout for the freeze figure (the smallest the API takes).
const HEARTBEAT_TIMEOUT_SEC: u64 = 10;

pub struct Figures {
    /// Runs on a base commit an earlier run cloned (`[tasks] checkout_cache`).
    pub queued_to_running_ms: Vec<f64>,
    /// Runs on a new base commit each (the base branch moved: a clone).
    pub queued_to_running_cloned_ms: Vec<f64>,
    /// Seconds from `running` to `failed` beyond the heartbeat timeout.
    pub heartbeat_loss_extra_sec: Option<f64>,
    /// The failure reason of a frozen run failed before its heartbeat timeout (not a figure).
    pub heartbeat_loss_early_failure: Option<String>,
    /// How the `sleep` runs that did not end `cancelled` ended (each should have).
    pub other_endings: Vec<String>,
}

/// How long a run that ended had been running, by its own `started_at` and `ended_at`.
fn running_for(run: &Value) -> Option<Duration> {
    let at = |k: &str| {
        run[k]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
    };
    let ran = at("ended_at")? - at("started_at")?;
    ran.to_std().ok()
}

fn git(dir: &Path, args: &[&str]) {
    let st = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=bench", "-c", "user.email=bench@localhost"])
        .args(args)
        .status()
        .expect("running git");
    assert!(st.success(), "git {args:?} failed");
}

/// A repository of about 10 MB (incompressible files in a few directories), one commit on `main`.
fn make_repo(root: &Path) {
    let repo = root.join("bench/r10");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for d in 0..10 {
        let dir = repo.join(format!("dir{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..10 {
            let mut bytes = vec![0u8; 100 * 1024];
            for b in bytes.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *b = seed as u8;
            }
            std::fs::write(dir.join(format!("f{f}.bin")), bytes).unwrap();
        }
    }
    std::fs::write(repo.join("README.md"), "bench repository\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "bench"]);
}

fn start(s: &Server, agent: &str) -> String {
    let (st, v) = s.call(
        KEY,
        "POST",
        "/api/v1/tasks",
        Some(json!({ "repository": "bench/r10", "base_branch": "main", "task": "bench", "agent": agent })),
    );
    assert_eq!(st, 201, "starting a task run: {v}");
    v["data"]["id"].as_str().unwrap().to_string()
}

fn state(s: &Server, id: &str) -> Value {
    let (_, v) = s.call(KEY, "GET", &format!("/api/v1/tasks/{id}"), None);
    v["data"].clone()
}

fn wait_terminal(s: &Server, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let t = state(s, id);
        if matches!(
            t["state"].as_str(),
            Some("stopped" | "failed" | "cancelled")
        ) || Instant::now() > deadline
        {
            return t;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn measure(s: &Server, data_dir: &Path, n: usize) -> Figures {
    make_repo(&data_dir.join("repos"));
    let (_, ws) = s.call(KEY, "GET", "/api/v1/workspaces", None);
    let ws = ws["data"][0]["id"]
        .as_str()
        .expect("a workspace")
        .to_string();
    let (st, v) = s.call(
        KEY,
        "PATCH",
        &format!("/api/v1/workspaces/{ws}"),
        Some(json!({ "settings": { "tasks_enabled": true, "heartbeat_timeout_sec": HEARTBEAT_TIMEOUT_SEC } })),
    );
    assert_eq!(st, 200, "enabling task runs: {v}");
    let (st, v) = s.call(
        KEY,
        "POST",
        &format!("/api/v1/workspaces/{ws}/wallet/credits"),
        Some(json!({ "amount": "1000.000000", "reference": "bench" })),
    );
    assert!(st == 200 || st == 201, "crediting the wallet: {v}");

    let repo = data_dir.join("repos/bench/r10");
    let other_endings = std::cell::RefCell::new(Vec::new());
    let one = |s: &Server| {
        let t = Instant::now();
        let id = start(s, "sleep");
        loop {
            let now = state(s, &id);
            match now["state"].as_str() {
                Some("running") => break,
                Some("queued" | "provisioning") => {}
                other => panic!("the run ended before running: {other:?} {now}"),
            }
            if t.elapsed() > Duration::from_secs(60) {
                panic!("the run did not start running within a minute");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let took = ms(t.elapsed());
        s.call(KEY, "POST", &format!("/api/v1/tasks/{id}/cancel"), None);
        let end = wait_terminal(s, &id);
        // A `sleep` run ends only when cancelled: any other end is a fault the figure hides.
        if end["state"] != "cancelled" {
            other_endings.borrow_mut().push(format!(
                "{} ({})",
                end["state"].as_str().unwrap_or("not ended"),
                end["failure_reason"].as_str().unwrap_or("")
            ));
        }
        took
    };
    // A new commit on the base before each: every run clones.
    let mut cloned = Vec::new();
    for _ in 0..n.div_ceil(2) {
        git(&repo, &["commit", "-q", "--allow-empty", "-m", "moved"]);
        cloned.push(one(s));
    }
    // The same base commit each time: the first run above kept it.
    let mut samples = Vec::new();
    for _ in 0..n {
        samples.push(one(s));
    }

    let id = start(s, "freeze");
    let mut running_at = None;
    let mut early_failure = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    let extra = loop {
        let now = state(s, &id);
        match now["state"].as_str() {
            Some("running") if running_at.is_none() => running_at = Some(Instant::now()),
            Some("failed") => {
                // From the run's own clock (`started_at` is when it began running), else from
                // when this loop first saw it running (which a slow answer can make late).
                let ran = running_for(&now).or_else(|| running_at.map(|r| r.elapsed()));
                let extra = ran.map(|d| d.as_secs_f64() - HEARTBEAT_TIMEOUT_SEC as f64);
                // A run failed before its heartbeat timeout failed for another reason: no figure.
                if extra.is_some_and(|x| x < 0.0) {
                    early_failure = Some(format!(
                        "{} after {:.1} s running",
                        now["failure_reason"].as_str().unwrap_or(""),
                        ran.unwrap_or_default().as_secs_f64()
                    ));
                    break None;
                }
                break extra;
            }
            Some("stopped" | "cancelled") => break None,
            _ => {}
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Figures {
        queued_to_running_ms: samples,
        queued_to_running_cloned_ms: cloned,
        heartbeat_loss_extra_sec: extra,
        heartbeat_loss_early_failure: early_failure,
        other_endings: other_endings.into_inner(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The run's own clock gives how long it ran; a run that never ran or has not ended gives
    /// nothing.
    #[test]
    fn how_long_a_run_ran_comes_from_its_own_timestamps() {
        let run = json!({"started_at": "2026-12-07T23:59:55.250Z", "ended_at": "2026-12-08T00:00:05.750Z"});
        assert_eq!(running_for(&run), Some(Duration::from_millis(10_500)));
        assert_eq!(
            running_for(&json!({"started_at": null, "ended_at": "2026-12-08T00:00:05.750Z"})),
            None
        );
        assert_eq!(
            running_for(&json!({"started_at": "2026-12-08T00:00:05.750Z", "ended_at": null})),
            None
        );
    }
}
