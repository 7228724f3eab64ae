//! The supervisor: heartbeats (a receiver written here stands in for the server's
//! `POST /gateway/tasks/heartbeat`), a `command` agent's exit code, stopping on SIGTERM and on
//! the server's 410.

mod common;

use cella_coder::{AgentSpec, Options};
use cella_types::TaskProgress;
use common::*;
use std::path::Path;

/// Not a test of its own: the supervisor's process in the tests that signal it.
#[test]
fn child_entry() {
    child_main();
}

fn options(workdir: &Path, heartbeat: &Stub, base: &str, argv: &[&str]) -> Options {
    Options {
        task_id: "task_test".into(),
        task: "a task".into(),
        heartbeat_url: format!("{}/gateway/tasks/heartbeat", heartbeat.url),
        heartbeat_sec: 1,
        token: TOKEN.into(),
        workdir: workdir.to_path_buf(),
        agent: AgentSpec::Command(argv.iter().map(|s| s.to_string()).collect()),
        base_sha: Some(base.into()),
    }
}

fn progress_of(r: &Request) -> TaskProgress {
    serde_json::from_slice(&r.body).expect("a TaskProgress body")
}

fn pid_in(dir: &Path) -> i32 {
    let f = dir.join("agent.pid");
    wait_until("the agent writes its pid", || {
        std::fs::read_to_string(&f)
            .map(|s| s.trim().parse::<i32>().is_ok())
            .unwrap_or(false)
    });
    std::fs::read_to_string(&f).unwrap().trim().parse().unwrap()
}

#[test]
fn heartbeats_carry_the_token_and_the_counts() {
    let (dir, base) = repo();
    let hb = heartbeat_receiver(None);
    // The agent (run in the checkout) makes two commits touching three files, waits for a few
    // heartbeats, and exits 0.
    let script =
        "echo one > a.txt && git add -A && git -c user.name=A -c user.email=a@b commit -qm one \
        && echo two > b.txt && echo x >> README.md && git add -A \
        && git -c user.name=A -c user.email=a@b commit -qm two && sleep 2.5";
    let code = cella_coder::supervise(options(dir.path(), &hb, &base, &["sh", "-c", script]));
    assert_eq!(code, 0);
    let reqs = hb.requests();
    assert!(
        reqs.len() >= 2,
        "a heartbeat at once and more: {}",
        reqs.len()
    );
    for r in &reqs {
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, "/gateway/tasks/heartbeat");
        assert_eq!(
            r.headers.get("authorization").map(String::as_str),
            Some(format!("Bearer {TOKEN}").as_str())
        );
        assert!(r
            .headers
            .get("content-type")
            .is_some_and(|c| c.starts_with("application/json")));
        progress_of(r);
    }
    let last = progress_of(reqs.last().unwrap());
    assert_eq!(
        last,
        TaskProgress {
            steps: 0,
            commits: 2,
            files_changed: 3
        }
    );
}

#[test]
fn the_exit_code_is_the_agents() {
    let (dir, base) = repo();
    let hb = heartbeat_receiver(None);
    let code = cella_coder::supervise(options(dir.path(), &hb, &base, &["sh", "-c", "exit 7"]));
    assert_eq!(code, 7);
    let code = cella_coder::supervise(options(dir.path(), &hb, &base, &["/nonexistent/agent"]));
    assert_eq!(code, 127);
}

#[test]
fn gone_from_the_server_stops_the_agent() {
    let (dir, base) = repo();
    // The second heartbeat is answered 410: the run is over.
    let hb = heartbeat_receiver(Some(2));
    let code = cella_coder::supervise(options(
        dir.path(),
        &hb,
        &base,
        &["sh", "-c", "echo $$ > agent.pid; exec sleep 1000"],
    ));
    assert_eq!(
        code,
        128 + libc::SIGTERM,
        "the agent was stopped with SIGTERM"
    );
    let pid = pid_in(dir.path());
    assert!(!process_exists(pid), "the agent is gone");
    assert_eq!(hb.requests().len(), 2, "no heartbeat after 410");
}

#[test]
fn sigterm_stops_the_agent_and_the_supervisor_exits() {
    let (dir, base) = repo();
    let hb = heartbeat_receiver(None);
    let mut sup = spawn_supervisor(
        dir.path(),
        &hb.url,
        &base,
        &["sh", "-c", "echo $$ > agent.pid; exec sleep 1000"],
        &[],
    );
    let pid = pid_in(dir.path());
    wait_until("a heartbeat", || !hb.requests().is_empty());
    unsafe { libc::kill(sup.id() as i32, libc::SIGTERM) };
    let code = wait_exit(&mut sup);
    assert_eq!(code, 128 + libc::SIGTERM);
    assert!(!process_exists(pid), "the agent is gone");
    let out = output_of(&mut sup);
    assert!(!out.contains(TOKEN), "the token is never printed");
}

#[test]
fn a_second_signal_kills_an_agent_that_ignores_sigterm() {
    let (dir, base) = repo();
    let hb = heartbeat_receiver(None);
    let mut sup = spawn_supervisor(
        dir.path(),
        &hb.url,
        &base,
        &[
            "sh",
            "-c",
            "trap '' TERM; echo $$ > agent.pid; while :; do sleep 0.1; done",
        ],
        &[],
    );
    let pid = pid_in(dir.path());
    unsafe { libc::kill(sup.id() as i32, libc::SIGTERM) };
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(process_exists(pid), "the agent ignores SIGTERM");
    unsafe { libc::kill(sup.id() as i32, libc::SIGTERM) };
    let code = wait_exit(&mut sup);
    assert_eq!(code, 128 + libc::SIGKILL);
    assert!(!process_exists(pid), "the agent is gone");
}

#[test]
fn a_bad_environment_exits_2_without_printing_the_token() {
    let (dir, base) = repo();
    let hb = heartbeat_receiver(None);
    let mut sup = spawn_supervisor(
        dir.path(),
        &hb.url,
        &base,
        &["true"],
        &[("CELLA_HEARTBEAT_URL", "")],
    );
    assert_eq!(wait_exit(&mut sup), 2);
    let out = output_of(&mut sup);
    assert!(out.contains("CELLA_HEARTBEAT_URL"), "{out}");
    assert!(!out.contains(TOKEN));
    assert!(hb.requests().is_empty());
}
