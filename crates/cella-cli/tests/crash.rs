//! Crash injection: the server killed with `SIGKILL` at each named step of create, boot, pause,
//! resume, stop, destroy, snapshot, fork, template build, task runs and billing (the crash
//! points of `cella-crash`, armed with `CELLA_CRASH_AT`, which only a debug build honours), then
//! started again on the same data directory with nothing armed.
//!
//! For every point the case asserts the server did die, by `SIGKILL`, at that point (its log
//! names it), and after the restart checks what a user and an operator would:
//!
//! - every sandbox is in a state that makes sense: a running one answers an exec, a paused or
//!   stopped one resumes and still has its files (a persistent sandbox's files survive a crash
//!   in any of its lifecycle steps), an `error` one says why; every one can be destroyed;
//! - every snapshot listed has its files and no snapshot's files are left without a row; every
//!   build and task run has ended (`failed` with an error) or finished, and the template can be
//!   built again;
//! - once everything is destroyed, nothing of this server is left: no cgroup, process or
//!   firewall chain of its instance, no sandbox directory, no mount or loop device of its data
//!   directory, no namespace (hence no veth) of a sandbox that ran before the crash, no host
//!   checkout of a run, no half-made layer;
//! - the ledger agrees with what ran: each stored sandbox and run has exactly one `compute`
//!   entry, nothing is reserved any more, and the balance is the sum of the entries.
//!
//! One test per operation family loops over its points; the families run in parallel.

mod common;
#[path = "common/forges.rs"]
mod forges;

use common::*;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const ARM: &str = "CELLA_CRASH_AT";
const RATE: &str = "0.001000";
const GIT_ID: &str = "git -c user.name=agent -c user.email=agent@example.org";

// ---------------------------------------------------------------------------------------------
// Money

fn money(v: &Value) -> i64 {
    let s = v.as_str().unwrap_or_else(|| panic!("not a decimal: {v}"));
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s),
    };
    let (w, f) = body.split_once('.').expect("six decimals");
    let m = w.parse::<i64>().unwrap() * 1_000_000 + f.parse::<i64>().unwrap();
    if neg {
        -m
    } else {
        m
    }
}

/// A workspace billed at [`RATE`] with 100 in its wallet (and task runs on); its admin key.
fn billed_workspace(s: &Server) -> (String, String) {
    let (ws, key) = s.workspace_key("developer", &["admin"]);
    let r = s.req(
        "PATCH",
        &format!("/api/v1/workspaces/{ws}"),
        Some(KEY),
        Some(&json!({ "settings": {
            "compute_rate": RATE, "tasks_enabled": true, "session_limit_min": 5,
            "heartbeat_timeout_sec": 60
        } })),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s.post(
        &format!("/api/v1/workspaces/{ws}/wallet/credits"),
        json!({ "amount": "100", "reference": "test credit" }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    (ws, key)
}

fn ledger(s: &Server, ws: &str) -> Vec<Value> {
    let r = s.get(&format!("/api/v1/workspaces/{ws}/ledger?limit=1000"));
    assert_eq!(r.status, 200, "{}", r.body);
    r.data().as_array().unwrap().clone()
}

/// Nothing reserved, the balance the sum of the entries (each `balance_after` following from
/// the one before), and exactly one `compute` entry per holder in `holders` (`sandbox_id` or
/// `task_id` values), none for anything else.
fn assert_ledger(s: &Server, ws: &str, holders: &HashSet<String>, what: &str) {
    // The settling of what was destroyed last happens just after its answer.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let w = s.get(&format!("/api/v1/workspaces/{ws}/wallet"));
        if w.data()["reserved"] == "0.000000" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: still reserved after everything ended: {}\n{}",
            w.body,
            tail(s)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let entries = ledger(s, ws);
    let mut sum = 0;
    for e in entries.iter().rev() {
        sum += money(&e["amount"]);
        assert_eq!(money(&e["balance_after"]), sum, "{what}: entry {e}");
    }
    let w = s.get(&format!("/api/v1/workspaces/{ws}/wallet"));
    assert_eq!(money(&w.data()["balance"]), sum, "{what}: {}", w.body);
    let mut seen: Vec<String> = entries
        .iter()
        .filter(|e| e["kind"] == "compute")
        .map(|e| {
            e["sandbox_id"]
                .as_str()
                .or(e["task_id"].as_str())
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    seen.sort();
    let mut want: Vec<String> = holders.iter().cloned().collect();
    want.sort();
    assert_eq!(
        seen, want,
        "{what}: compute entries per holder: {entries:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The host

fn instance(s: &Server) -> String {
    std::fs::read_to_string(s.data_dir().join("instance-id"))
        .unwrap()
        .trim()
        .to_string()
}

/// Cgroup directories under this server's instance, in every hierarchy.
fn instance_cgroups(s: &Server) -> Vec<PathBuf> {
    let inst = instance(s);
    let roots: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    for root in roots.into_iter().chain([PathBuf::from("/sys/fs/cgroup")]) {
        if let Ok(rd) = std::fs::read_dir(root.join("cella").join(&inst)) {
            out.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
    }
    out
}

/// Processes in a cgroup of this server's instance.
fn instance_processes(s: &Server) -> Vec<i32> {
    let needle = format!("/cella/{}/", instance(s));
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|c| c.lines().any(|l| l.contains(&needle)))
        })
        .collect()
}

/// Loop devices backed by a file under this server's data directory.
fn loop_devices(s: &Server) -> Vec<String> {
    let data = s.data_dir().display().to_string();
    std::fs::read_dir("/sys/block")
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
                .filter_map(|e| {
                    let f = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
                    // The disk pool's images, mounted ahead, are the running server's own (as
                    // its files there are): they go with its process. One whose file is gone
                    // (a start empties the pool) is a leak.
                    let pool = f.starts_with(&format!("{data}/disks/"))
                        && !f.trim().ends_with("(deleted)");
                    (f.starts_with(&data) && !pool).then(|| f.trim().to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Mounts (in the host's mount namespace) of anything under this server's data directory.
fn mounts(s: &Server) -> Vec<String> {
    let data = s.data_dir().display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&data))
        .map(String::from)
        .collect()
}

fn dir_names(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The namespaces of a sandbox's init (recorded before a crash, to check they are gone).
fn sandbox_namespaces(id: &str) -> Vec<String> {
    sandbox_pids(id)
        .first()
        .map(|p| namespaces(*p))
        .unwrap_or_default()
        .into_iter()
        // The user namespace may be shared (no user namespaces on this host): not the sandbox's.
        .filter(|n| !n.starts_with("user:"))
        .collect()
}

/// Of the namespaces `known` (of this server's sandboxes before the crash), those a process
/// still holds. A holder in a cgroup of another server's sandbox does not count: the kernel
/// reuses a freed namespace's number, and other tests run sandboxes at the same time.
fn namespaces_held(s: &Server, known: &[String]) -> Vec<String> {
    if known.is_empty() {
        return Vec::new();
    }
    let ours = format!("/cella/{}/", instance(s));
    let mut held = Vec::new();
    for pid in std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
    {
        let ns = namespaces(pid);
        if !ns.iter().any(|n| known.contains(n)) || common::waiting_launcher(pid) {
            continue;
        }
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if cg.contains("/cella/") && !cg.contains(&ours) {
            continue;
        }
        held.extend(ns.into_iter().filter(|n| known.contains(n)));
    }
    held.sort();
    held.dedup();
    held
}

/// Whether the cgroup of sandbox `id` is frozen (cgroup v2 `cgroup.events`, else v1's
/// freezer).
fn frozen(id: &str) -> bool {
    cgroup_dirs(id).iter().any(|d| {
        std::fs::read_to_string(d.join("cgroup.events"))
            .is_ok_and(|e| e.lines().any(|l| l == "frozen 1"))
            || std::fs::read_to_string(d.join("freezer.state"))
                .is_ok_and(|f| f.trim() == "FROZEN" || f.trim() == "FREEZING")
    })
}

/// Once every sandbox is destroyed: nothing of this server is left on the host. (Generous
/// waits: a destroy removes a boot's firewall chain just after its answer, and on a loaded
/// host deleting nftables objects waits for the kernel.)
fn assert_nothing_left(s: &Server, known_ns: &[String], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let cg = instance_cgroups(s);
        let procs = instance_processes(s);
        let chains = firewall_chains(&instance(s));
        let dirs = dir_names(&s.data_dir().join("sandboxes"));
        let loops = loop_devices(s);
        let mnts = mounts(s);
        let ns = namespaces_held(s, known_ns);
        let tasks = dir_names(&s.data_dir().join("tasks"));
        let clean = cg.is_empty()
            && procs.is_empty()
            && chains.is_empty()
            && dirs.is_empty()
            && loops.is_empty()
            && mnts.is_empty()
            && ns.is_empty()
            && tasks.is_empty();
        if clean {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: left on the host: cgroups {cg:?}, processes {procs:?}, chains {chains:?}, \
             sandbox dirs {dirs:?}, loop devices {loops:?}, mounts {mnts:?}, namespaces {ns:?}, \
             task dirs {tasks:?}\n{}",
            tail(s)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Snapshot files: exactly the snapshots the store lists.
    let mut listed: Vec<String> = s
        .get("/api/v1/snapshots?limit=100")
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap().to_string())
        .collect();
    listed.sort();
    assert_eq!(
        dir_names(&s.data_dir().join("snapshots")),
        listed,
        "{what}: snapshot files"
    );
    // Layers: every one complete (no half-exported step left).
    for l in dir_names(&s.data_dir().join("layers")) {
        let d = s.data_dir().join("layers").join(&l);
        if d.join("root").exists() || d.join("root.part").exists() {
            assert!(
                d.join("complete").exists() && !d.join("root.part").exists(),
                "{what}: a half-made layer {l}: {:?}",
                dir_names(&d)
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The crash

/// The end of the server's log.
fn tail(s: &Server) -> String {
    let log = s.log();
    let mut n = log.len().saturating_sub(6000);
    while !log.is_char_boundary(n) {
        n -= 1;
    }
    log[n..].to_string()
}

/// Waits for the server to die at `point` (by `SIGKILL`, its log naming the point), then starts
/// it again on the same data directory with nothing armed.
fn expect_crash_and_restart(s: &mut Server, point: &str) {
    let st = s.wait_exit(120).unwrap_or_else(|| {
        panic!(
            "{point}: the server did not die at its crash point\n{}",
            tail(s)
        )
    });
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{point}: ended by {st:?}");
    let name = point.split(':').next().unwrap();
    assert!(
        s.log().contains(&format!("crash point {name} ({ARM})")),
        "{point}: the log does not name the point\n{}",
        tail(s)
    );
    s.restart_with_env(&[]);
}

/// Sends a request the server is expected to die in (its answer, if any, is ignored).
fn doomed(s: &Server, key: &str, method: &str, path: &str, body: Value) {
    let body = (!body.is_null()).then(|| body.to_string().into_bytes());
    let _ = s.try_raw(method, path, Some(key), body, &[]);
}

fn sandboxes(s: &Server, key: &str) -> Vec<Value> {
    let r = s.req(
        "GET",
        "/api/v1/sandboxes?state=all&limit=100",
        Some(key),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.data().as_array().unwrap().clone()
}

/// Every sandbox of the workspace is in a state that makes sense and can be used or is cleanly
/// ended; `files` are (sandbox, path, content) that must have survived. Then every one is
/// destroyed. Answers the ids of every sandbox seen (for the ledger).
fn check_and_destroy_all(
    s: &Server,
    key: &str,
    files: &[(String, String, String)],
    what: &str,
) -> HashSet<String> {
    let mut ids = HashSet::new();
    for sb in sandboxes(s, key) {
        let id = sb["id"].as_str().unwrap().to_string();
        let st = sb["state"].as_str().unwrap().to_string();
        ids.insert(id.clone());
        match st.as_str() {
            "running" | "paused" | "stopped" => {
                // Frozen exactly when its row says paused (a paused sandbox runs nothing, a
                // running one is not stuck).
                if st != "stopped" {
                    assert_eq!(
                        frozen(&id),
                        st == "paused",
                        "{what}: {id} is {st}; its processes frozen: {}",
                        frozen(&id)
                    );
                }
                if st != "running" {
                    let r = s.req(
                        "POST",
                        &format!("/api/v1/sandboxes/{id}/resume"),
                        Some(key),
                        Some(&json!({})),
                    );
                    assert_eq!(r.status, 200, "{what}: resume {id} ({st}): {}", r.body);
                    assert_eq!(r.data()["state"], "running", "{what}: {}", r.body);
                }
                let r = s.req(
                    "POST",
                    &format!("/api/v1/sandboxes/{id}/exec"),
                    Some(key),
                    Some(&json!({ "command": "echo alive", "timeout_sec": 20 })),
                );
                assert_eq!(r.status, 200, "{what}: exec in {id} ({st}): {}", r.body);
                assert_eq!(r.data()["stdout"], "alive\n", "{what}: {}", r.body);
                for (fid, path, content) in files.iter().filter(|f| f.0 == id) {
                    let r = s.req(
                        "POST",
                        &format!("/api/v1/sandboxes/{fid}/exec"),
                        Some(key),
                        Some(&json!({ "command": format!("cat {path}") })),
                    );
                    assert_eq!(
                        r.data()["stdout"].as_str(),
                        Some(content.as_str()),
                        "{what}: the files of {fid} ({st} before the restart): {}",
                        r.body
                    );
                }
            }
            "error" => {
                assert!(
                    sb["state_reason"].as_str().is_some_and(|r| !r.is_empty()),
                    "{what}: an error without a reason: {sb}"
                );
                assert!(
                    !files.iter().any(|f| f.0 == id),
                    "{what}: a persistent sandbox lost its files: {sb}"
                );
            }
            "destroyed" => continue,
            other => panic!("{what}: sandbox {id} is {other} after the restart: {sb}"),
        }
        let r = s.req(
            "DELETE",
            &format!("/api/v1/sandboxes/{id}"),
            Some(key),
            None,
        );
        assert_eq!(r.status, 200, "{what}: destroy {id}: {}", r.body);
        assert_eq!(r.data()["state"], "destroyed", "{what}: {}", r.body);
    }
    ids
}

/// One crash case: a server armed at `point`; `setup` brings the workspace where the step is
/// about to happen (answering the files that must survive); `act` does the step (the server
/// dies in it); after the restart everything is checked, cleaned and checked again.
fn case(
    config: &str,
    point: &str,
    setup: impl FnOnce(&Server, &str) -> Vec<(String, String, String)>,
    act: impl FnOnce(&Server, &str),
    after: impl FnOnce(&Server, &str),
) {
    let mut s = Server::start_env(config, &[(ARM, point)]);
    let (ws, key) = billed_workspace(&s);
    let files = setup(&s, &key);
    let ns: Vec<String> = sandboxes(&s, &key)
        .iter()
        .flat_map(|sb| sandbox_namespaces(sb["id"].as_str().unwrap()))
        .collect();
    act(&s, &key);
    expect_crash_and_restart(&mut s, point);
    after(&s, &key);
    // Still usable: a new sandbox starts and runs a command.
    let fresh = s.create_as(&key, json!({ "persistent": false }));
    assert_eq!(sh(&s, &key, &fresh, "echo fresh")["stdout"], "fresh\n");
    let mut holders = check_and_destroy_all(&s, &key, &files, point);
    assert_nothing_left(&s, &ns, point);
    for t in tasks(&s, &key) {
        holders.insert(t["id"].as_str().unwrap().to_string());
    }
    assert_ledger(&s, &ws, &holders, point);
}

fn nothing(_: &Server, _: &str) -> Vec<(String, String, String)> {
    Vec::new()
}

/// A persistent sandbox with a file in it; (sandbox, path, content).
fn with_file(s: &Server, key: &str) -> (String, String, String) {
    let id = s.create_as(key, json!({ "persistent": true }));
    let r = s.req(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec"),
        Some(key),
        Some(&json!({ "command": "echo kept > /home/user/kept.txt && sync" })),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    (id, "/home/user/kept.txt".into(), "kept\n".into())
}

/// Runs a command in a sandbox of the workspace of `key`.
fn sh(s: &Server, key: &str, id: &str, command: &str) -> Value {
    let r = s.req(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec"),
        Some(key),
        Some(&json!({ "command": command, "timeout_sec": 20 })),
    );
    assert_eq!(r.status, 200, "exec in {id}: {}", r.body);
    r.data().clone()
}

fn post(s: &Server, key: &str, path: &str) -> R {
    s.req("POST", path, Some(key), Some(&json!({})))
}

// ---------------------------------------------------------------------------------------------
// The families

#[test]
fn crash_at_each_step_of_create_and_boot() {
    for point in [
        "billing.reserve.after",
        "sandbox.create.after_reserve",
        "sandbox.create.after_insert",
        "runtime.launch.after_cgroup",
        "runtime.launch.after_disk",
        "runtime.launch.after_init",
        "runtime.launch.after_network",
        "sandbox.boot.before_ready_write",
    ] {
        case(
            "",
            point,
            nothing,
            |s, key| {
                doomed(
                    s,
                    key,
                    "POST",
                    "/api/v1/sandboxes",
                    json!({ "persistent": true }),
                )
            },
            |s, key| {
                // The sandbox whose create was cut short ended honestly (or was never made).
                for sb in sandboxes(s, key) {
                    assert_eq!(sb["state"], "error", "{point}: {sb}");
                }
            },
        );
    }
}

#[test]
fn crash_at_each_step_of_pause_resume_stop_and_a_cold_boot() {
    type Step = fn(&Server, &str, &str);
    let pause: Step = |s, key, id| {
        assert_eq!(
            post(s, key, &format!("/api/v1/sandboxes/{id}/pause")).status,
            200
        )
    };
    let stop: Step = |s, key, id| {
        assert_eq!(
            post(s, key, &format!("/api/v1/sandboxes/{id}/stop")).status,
            200
        )
    };
    let none: Step = |_, _, _| {};
    let cases: [(&str, Step, &str); 6] = [
        ("sandbox.pause.after_freeze", none, "pause"),
        ("sandbox.resume.after_thaw", pause, "resume"),
        ("sandbox.stop.after_teardown", none, "stop"),
        ("sandbox.resume.after_claim", stop, "resume"),
        // The cold boot of a stopped sandbox is its second launch.
        ("runtime.launch.after_disk:2", stop, "resume"),
        ("sandbox.boot.before_ready_write:2", stop, "resume"),
    ];
    for (point, before, verb) in cases {
        let id = std::cell::RefCell::new(String::new());
        case(
            "",
            point,
            |s, key| {
                let f = with_file(s, key);
                before(s, key, &f.0);
                *id.borrow_mut() = f.0.clone();
                vec![f]
            },
            |s, key| {
                let id = id.borrow();
                doomed(
                    s,
                    key,
                    "POST",
                    &format!("/api/v1/sandboxes/{id}/{verb}"),
                    json!({}),
                )
            },
            |s, key| {
                let id = id.borrow();
                let r = s.req("GET", &format!("/api/v1/sandboxes/{id}"), Some(key), None);
                let st = r.data()["state"].as_str().unwrap_or_default().to_string();
                assert!(
                    ["running", "paused", "stopped"].contains(&st.as_str()),
                    "{point}: a persistent sandbox is {st} after the restart: {}",
                    r.body
                );
            },
        );
    }
}

#[test]
fn crash_at_each_step_of_destroy_and_of_settling() {
    // (point, persistent, in the teardown): a destroy answers once its row is `destroyed` and
    // settled, and tears the sandbox down on the host after that; a kill in the teardown leaves
    // the row destroyed (a persistent sandbox does not come back `stopped`) and the restart
    // clears what it left.
    for (point, persistent, teardown) in [
        ("sandbox.destroy.after_state_write", false, false),
        ("billing.settle.before", false, false),
        ("billing.settle.entry_written", false, false),
        ("billing.settle.committed", false, false),
        ("sandbox.destroy.teardown", false, true),
        ("sandbox.destroy.teardown", true, true),
        ("runtime.remove.after_kill", false, true),
        ("runtime.remove.after_kill", true, true),
    ] {
        let id = std::cell::RefCell::new(String::new());
        case(
            "",
            point,
            |s, key| {
                *id.borrow_mut() = s.create_as(key, json!({ "persistent": persistent }));
                if persistent {
                    // Its files, which the destroy must not bring back.
                    sh(
                        s,
                        key,
                        &id.borrow(),
                        "echo kept > /home/user/kept.txt && sync",
                    );
                }
                Vec::new()
            },
            |s, key| {
                let id = id.borrow();
                doomed(
                    s,
                    key,
                    "DELETE",
                    &format!("/api/v1/sandboxes/{id}"),
                    Value::Null,
                )
            },
            |s, key| {
                let id = id.borrow();
                let r = s.req("GET", &format!("/api/v1/sandboxes/{id}"), Some(key), None);
                let st = r.data()["state"].as_str().unwrap_or("");
                if teardown {
                    assert_eq!(
                        st, "destroyed",
                        "{point} (persistent {persistent}): {}",
                        r.body
                    );
                } else {
                    assert!(["destroyed", "error"].contains(&st), "{point}: {}", r.body);
                }
            },
        );
    }
}

#[test]
fn crash_at_each_step_of_snapshot_and_fork() {
    let cases: [(&str, &str); 5] = [
        ("runtime.snapshot.frozen", "snapshots"),
        ("snapshot.take.after_copy", "snapshots"),
        ("fork.after_snapshot", "fork"),
        ("fork.after_children_insert", "fork"),
        ("fork.before_snapshot_removal", "fork"),
    ];
    for (point, verb) in cases {
        let id = std::cell::RefCell::new(String::new());
        case(
            "",
            point,
            |s, key| {
                let f = with_file(s, key);
                *id.borrow_mut() = f.0.clone();
                vec![f]
            },
            |s, key| {
                let id = id.borrow();
                let body = if verb == "fork" {
                    json!({ "count": 2 })
                } else {
                    json!({})
                };
                doomed(
                    s,
                    key,
                    "POST",
                    &format!("/api/v1/sandboxes/{id}/{verb}"),
                    body,
                )
            },
            |s, key| {
                // The source runs on, not frozen.
                let id = id.borrow();
                let r = s.req("GET", &format!("/api/v1/sandboxes/{id}"), Some(key), None);
                assert_eq!(r.data()["state"], "running", "{point}: {}", r.body);
                // Its disk's flushes, deferred for the copy, are honoured again: the
                // device reports its write cache (the start turns back what a killed server
                // left).
                let device = std::fs::read_dir("/sys/block")
                    .unwrap()
                    .flatten()
                    .find(|e| {
                        std::fs::read_to_string(e.path().join("loop/backing_file"))
                            .is_ok_and(|b| b.contains(id.as_str()))
                    })
                    .expect("the source's loop device");
                let cache = std::fs::read_to_string(device.path().join("queue/write_cache"));
                assert_eq!(cache.unwrap().trim(), "write back", "{point}");
                // A snapshot taken now works and serves a new sandbox.
                let snap = post(s, key, &format!("/api/v1/sandboxes/{id}/snapshots"));
                assert_eq!(snap.status, 201, "{point}: {}", snap.body);
                let sid = snap.data()["id"].as_str().unwrap().to_string();
                let from = s.create_as(key, json!({ "snapshot_id": sid, "persistent": false }));
                assert_eq!(
                    sh(s, key, &from, "cat /home/user/kept.txt")["stdout"],
                    "kept\n"
                );
                let d = s.req(
                    "DELETE",
                    &format!("/api/v1/snapshots/{sid}"),
                    Some(key),
                    None,
                );
                assert_eq!(d.status, 200, "{}", d.body);
            },
        );
    }
}

#[test]
fn crash_at_each_step_of_a_template_build() {
    for point in [
        "build.step.after_boot",
        "build.step.after_export",
        "build.before_image_write",
    ] {
        let spec = json!({
            "id": "crashy",
            "steps": [ { "run": "echo built > /opt-built.txt" } ],
            "default_size": "xs"
        });
        let build_id = std::cell::RefCell::new(String::new());
        case(
            "",
            point,
            nothing,
            |s, key| {
                let r = s.req("POST", "/api/v1/templates", Some(key), Some(&spec));
                assert_eq!(r.status, 202, "{}", r.body);
                *build_id.borrow_mut() = r.data()["id"].as_str().unwrap().to_string();
            },
            |s, key| {
                let b = wait_build(s, key, "crashy", &build_id.borrow());
                assert_eq!(b["state"], "failed", "{point}: {b}");
                assert!(b["error"].as_str().is_some_and(|e| !e.is_empty()), "{b}");
                // Built again, it serves sandboxes.
                let b = build(s, key, &spec);
                assert_eq!(b["state"], "ready", "{point}: {b}");
                let id = s.create_as(key, json!({ "template_id": "crashy", "persistent": false }));
                assert_eq!(sh(s, key, &id, "cat /opt-built.txt")["stdout"], "built\n");
            },
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Task runs

fn task_config(repos: &Path) -> String {
    let script = format!(
        "echo work > work.txt && {GIT_ID} add -A && {GIT_ID} commit -qm 'Some work' && exit 0"
    );
    format!(
        "[tasks]\nrunners = 1\nheartbeat_interval_sec = 1\ngrace_sec = 2\n\n\
         [[forges]]\nname = \"git\"\nkind = \"git\"\nurl_template = \"{}/{{repository}}.git\"\n\n\
         [[agents]]\nname = \"script\"\nkind = \"command\"\ncommand = [\"bash\", \"-c\", '''{script}''']\n",
        repos.display()
    )
}

fn tasks(s: &Server, key: &str) -> Vec<Value> {
    let r = s.req("GET", "/api/v1/tasks?limit=100", Some(key), None);
    if r.status != 200 {
        return Vec::new();
    }
    r.data().as_array().cloned().unwrap_or_default()
}

#[test]
fn crash_at_each_step_of_a_task_run() {
    for point in [
        "task.provision.after_sandbox_id",
        "task.push.after_push",
        "task.settle.after_end",
    ] {
        let repos = tempfile::tempdir().unwrap();
        forges::make_repo(repos.path(), "acme/web", &[("README.md", "# web\n")]);
        case(
            &task_config(repos.path()),
            point,
            nothing,
            |s, key| {
                doomed(
                    s,
                    key,
                    "POST",
                    "/api/v1/tasks",
                    json!({ "repository": "acme/web", "task": "work" }),
                )
            },
            |s, key| {
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let ts = tasks(s, key);
                    assert_eq!(ts.len(), 1, "{point}: {ts:?}");
                    let st = ts[0]["state"].as_str().unwrap_or_default();
                    if ["stopped", "failed", "cancelled"].contains(&st) {
                        if st == "failed" {
                            assert!(
                                ts[0]["failure_reason"]
                                    .as_str()
                                    .is_some_and(|r| !r.is_empty()),
                                "{point}: {}",
                                ts[0]
                            );
                        }
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "{point}: the run did not end: {}",
                        ts[0]
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
            },
        );
    }
}
