//! The warm pool: readiness that follows it, creates that take it, refills, plan caps, and
//! pool sandboxes that stay out of every workspace.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn readiness(s: &Server, size: &str) -> String {
    let t = s.get("/api/v1/templates/base");
    let sizes = t.data()["sizes"].as_array().unwrap().clone();
    sizes
        .iter()
        .find(|z| z["size"] == size)
        .map(|z| z["state"].as_str().unwrap().to_string())
        .unwrap()
}

fn wait_for(s: &Server, size: &str, state: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while readiness(s, size) != state {
        assert!(
            Instant::now() < deadline,
            "{size} never became {state}: {}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn readiness_follows_the_pool_as_it_drains_and_refills() {
    // One xs sandbox ahead, and at least 1.5 s between pool boots so the drained state is seen.
    let s =
        Server::start_with("[pool]\ndefault = 0\nsizes = { xs = 1 }\nboot_interval_ms = 1500\n");
    wait_for(&s, "xs", "fast_ready");
    // Sizes without a pool must boot: cold.
    assert_eq!(readiness(&s, "small"), "cold_boot_only");
    assert_eq!(readiness(&s, "medium"), "cold_boot_only");

    // The create takes the pool sandbox: it is running at once, with the request's settings.
    let r = s.post(
        "/api/v1/sandboxes",
        json!({ "size": "xs", "metadata": { "run": "7" }, "timeout_sec": 120, "persistent": false, "env": { "FROM": "req" } }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let sb = r.data().clone();
    let id = sb["id"].as_str().unwrap().to_string();
    assert_eq!(sb["state"], "running");
    assert_eq!(sb["ready"], true);
    assert_eq!(sb["metadata"], json!({ "run": "7" }));
    assert_eq!(sb["timeout_sec"], 120);
    assert_eq!(sb["persistent"], false);
    assert!(sb["timeout_remaining_ms"].as_i64().unwrap() > 110_000);
    assert_eq!(sb["total_runtime_sec"], Value::Null);
    // Drained now; the refill waits for its interval.
    assert_eq!(readiness(&s, "xs"), "cold_boot_only");
    // It is the caller's sandbox in every way.
    assert_eq!(
        s.sh(&id, "echo $FROM; hostname")["stdout"],
        format!("req\n{id}\n")
    );
    let list = s.get("/api/v1/sandboxes");
    assert_eq!(
        list.data()[0]["id"],
        id.as_str(),
        "the claimed sandbox lists as the newest"
    );
    let usage = s.get(&format!("/api/v1/sandboxes/{id}/usage"));
    assert!(
        usage.data()["running_sec"]
            .as_f64()
            .unwrap_or_else(|| panic!("{}", usage.body))
            < 5.0,
        "{}",
        usage.body
    );

    // Refilled in the background.
    wait_for(&s, "xs", "fast_ready");
    // A create while the pool is empty still works (cold).
    let a = s.create(json!({ "size": "xs" }));
    let b = s.create(json!({ "size": "xs" }));
    assert_ne!(a, b);
    for x in [&id, &a, &b] {
        assert_eq!(s.sh(x, "echo ok")["stdout"], "ok\n");
    }
}

#[test]
fn the_refill_waits_its_delay_after_a_claim_so_the_claimed_sandbox_has_the_cpu() {
    // Without the delay a refill boot is under a second here; with two seconds of delay the
    // drained pool is still drained a second after the claim, and refilled after.
    let s = Server::start_with("[pool]\ndefault = 0\nsizes = { xs = 1 }\nrefill_delay_ms = 2000\n");
    wait_for(&s, "xs", "fast_ready");
    let claimed_at = Instant::now();
    let id = s.create(json!({ "size": "xs" }));
    assert_eq!(
        readiness(&s, "xs"),
        "cold_boot_only",
        "the create took the pool's sandbox"
    );
    assert_eq!(s.sh(&id, "echo first")["stdout"], "first\n");
    std::thread::sleep(Duration::from_millis(1000).saturating_sub(claimed_at.elapsed()));
    assert_eq!(
        readiness(&s, "xs"),
        "cold_boot_only",
        "no refill boot within the delay: {}",
        s.log()
    );
    wait_for(&s, "xs", "fast_ready");
    assert!(claimed_at.elapsed() >= Duration::from_secs(2));
}

/// Sandboxes of this server that have a cgroup (every one has, pool sandboxes included).
fn sandboxes_on_host(s: &Server) -> Vec<String> {
    let instance = std::fs::read_to_string(s.data_dir().join("instance-id")).unwrap();
    let mut ids: Vec<String> = ["/sys/fs/cgroup/freezer/cella", "/sys/fs/cgroup/cella"]
        .iter()
        .filter_map(|root| std::fs::read_dir(format!("{root}/{}", instance.trim())).ok())
        .flat_map(|rd| rd.flatten())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("sb"))
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// The processes in a sandbox's exec cgroups (with no exec running: the one made ahead for
/// its next exec), host pids.
fn exec_group_processes(id: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for d in cgroup_dirs(id) {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with("exec-") {
                if let Ok(t) = std::fs::read_to_string(e.path().join("cgroup.procs")) {
                    out.extend(t.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
                }
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// A host process's pid inside its sandbox (the last of `NSpid`).
fn inner_pid(host_pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{host_pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|l| l.split_whitespace().last())
        .unwrap()
        .to_string()
}

#[test]
fn a_claim_has_the_process_the_first_exec_starts_in_made_again_and_that_exec_runs_in_it() {
    let s = Server::start_with("[pool]\ndefault = 0\nsizes = { xs = 1 }\n");
    wait_for(&s, "xs", "fast_ready");
    let pooled = sandboxes_on_host(&s);
    assert_eq!(pooled.len(), 1, "one pool sandbox: {pooled:?}");
    let waiting = exec_group_processes(&pooled[0]);
    assert_eq!(
        waiting.len(),
        1,
        "one process waits for the first exec: {waiting:?}"
    );
    // Older than the agent's 10 ms of freshness.
    std::thread::sleep(Duration::from_millis(100));
    let id = s.create(json!({ "size": "xs" }));
    assert_eq!(id, pooled[0], "the create took the pool's sandbox");
    // Where cgroup moves are fast, the claim's question to the agent had it fork that process
    // again, and the old one exited without running anything; elsewhere it still waits.
    let fast_moves = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.contains(" - cgroup") && l.contains("favordynmods"));
    if !fast_moves {
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(exec_group_processes(&id), waiting);
        assert_eq!(s.sh(&id, "echo ok")["stdout"], "ok\n");
        return;
    }
    let mut fresh = Vec::new();
    eventually("a new process waiting for the first exec", || {
        fresh = exec_group_processes(&id);
        fresh.len() == 1 && fresh != waiting
    });
    eventually("the old waiting process to be gone", || {
        !std::path::Path::new(&format!("/proc/{}", waiting[0])).exists()
    });
    // The first exec runs in the new one: its pid inside the sandbox is the shell's.
    let inner = inner_pid(fresh[0]);
    assert_eq!(s.sh(&id, "echo $$")["stdout"], format!("{inner}\n"));
    // A sandbox's later commands are not affected: the next exec starts in a process made
    // when the first one ended, as always.
    assert_eq!(s.sh(&id, "echo ok")["stdout"], "ok\n");
}

/// The process a sandbox's next exec starts in is forked without the agent's heap (so the
/// agent's own writes while it waits cost it no copies), and a command started in it is
/// confined exactly as one the agent forks: no new privileges, a root command with the root
/// capabilities only, a user's with none, a missing program the shell's 127.
#[test]
fn the_process_made_ahead_holds_no_heap_of_the_agents_and_confines_its_command() {
    let s = Server::start_with("[pool]\ndefault = 0\n");
    let id = s.create(json!({ "size": "xs" }));
    let status = |user: &str| {
        let out = s.exec(
            &id,
            json!({ "command": "echo $$; id -u; id -G; grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' /proc/self/status", "user": user }),
        );
        assert_eq!(out["exit_code"], 0, "{out}");
        out["stdout"].as_str().unwrap().to_string()
    };
    // Docker's default set without mknod and net_raw (the agent's ROOT_CAPS).
    let root_caps = "00000000a00405fb";
    for round in 0..3 {
        let mut waiting = Vec::new();
        eventually("a process waiting for the next exec", || {
            waiting = exec_group_processes(&id);
            waiting.len() == 1
        });
        let maps = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let agent: u32 = std::fs::read_to_string(format!("/proc/{}/status", waiting[0]))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            maps(agent).contains("[heap]"),
            "round {round}: the agent has a heap"
        );
        assert!(
            !maps(waiting[0]).contains("[heap]"),
            "round {round}: the waiting process maps the agent's heap:\n{}",
            maps(waiting[0])
        );
        // The command runs in that process: its pid inside is the shell's.
        let inner = inner_pid(waiting[0]);
        let (user, want) = if round % 2 == 0 {
            ("root", format!("{inner}\n0\n0\nCapInh:\t0000000000000000\nCapPrm:\t{root_caps}\nCapEff:\t{root_caps}\nCapBnd:\t{root_caps}\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n"))
        } else {
            ("user", format!("{inner}\n1000\n1000\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t{root_caps}\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n"))
        };
        assert_eq!(status(user), want, "round {round}, as {user}");
    }
    // A signal the agent handles, sent to the waiting process by a root command, finds the
    // default there (for SIGCHLD: nothing), not a handler of the agent's.
    let mut waiting = Vec::new();
    eventually("a process waiting for the next exec", || {
        waiting = exec_group_processes(&id);
        waiting.len() == 1
    });
    let inner = inner_pid(waiting[0]);
    // From a background process, which starts in a process of its own (an exec would start
    // in the waiting one).
    let p = s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "command": format!("kill -CHLD {inner} && kill -CHLD {inner}"), "user": "root" }),
    );
    assert_eq!(p.status, 201, "{}", p.body);
    let pid = p.data()["pid"].as_i64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let p = s.get(&format!("/api/v1/sandboxes/{id}/processes/{pid}"));
        if p.data()["state"] == "exited" {
            assert_eq!(p.data()["exit_code"], 0, "{}", p.body);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the signalling process did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        std::path::Path::new(&format!("/proc/{}", waiting[0])).exists(),
        "the waiting process died of a SIGCHLD"
    );
    assert_eq!(s.sh(&id, "echo $$")["stdout"], format!("{inner}\n"));
    // Errors of the start itself come back as a shell's.
    let out = s.exec(&id, json!({ "argv": ["no-such-program"] }));
    assert_eq!(out["exit_code"], 127, "{out}");
    assert!(
        out["stderr"]
            .as_str()
            .unwrap()
            .contains("command not found"),
        "{out}"
    );
    let out = s.exec(&id, json!({ "argv": ["python3", "-c", "print(6 * 7)"] }));
    assert_eq!(out["stdout"], "42\n", "{out}");
}

#[test]
fn pool_sandboxes_belong_to_no_workspace_and_respect_caps_and_policies() {
    let s = Server::start_with("[pool]\ndefault = 0\nsizes = { xs = 2 }\n");
    wait_for(&s, "xs", "fast_ready");
    // Nobody sees the pool: not in the sandbox list, not as a workspace.
    assert!(s
        .get("/api/v1/sandboxes")
        .data()
        .as_array()
        .unwrap()
        .is_empty());
    let ws = s.get("/api/v1/workspaces");
    assert!(
        ws.data()
            .as_array()
            .unwrap()
            .iter()
            .all(|w| !w["name"].as_str().unwrap().contains("pool")),
        "{}",
        ws.body
    );

    // A developer workspace at its cap gets no pool sandbox either.
    let (_, key) = s.workspace_key(
        "developer",
        &["sandboxes:read", "sandboxes:write", "sandboxes:exec"],
    );
    let mut mine = Vec::new();
    for _ in 0..10 {
        mine.push(s.create_as(&key, json!({ "size": "xs" })));
    }
    let r = s.req(
        "POST",
        "/api/v1/sandboxes",
        Some(&key),
        Some(&json!({ "size": "xs" })),
    );
    r.assert_error(429, "CONCURRENCY_LIMIT");
    assert_eq!(
        s.req("GET", "/api/v1/sandboxes", Some(&key), None)
            .data()
            .as_array()
            .unwrap()
            .len(),
        10
    );

    // A claimed sandbox gets the egress policy the request names.
    wait_for(&s, "xs", "fast_ready");
    let id = s.create(json!({ "size": "xs", "network": { "egress": "deny" } }));
    let got = s.get(&format!("/api/v1/sandboxes/{id}"));
    assert_eq!(got.data()["network"]["egress"], "deny");
    let instance = std::fs::read_to_string(s.data_dir().join("instance-id")).unwrap();
    let prefix = format!("sb_{}_{id}_", instance.trim());
    let chain_name = firewall_chains(instance.trim())
        .into_iter()
        .find(|c| c.starts_with(&prefix))
        .expect("the claimed sandbox has a chain");
    let out = std::process::Command::new("nft")
        .args(["list", "chain", "inet", "cella", &chain_name])
        .output()
        .unwrap();
    let chain = String::from_utf8_lossy(&out.stdout);
    assert!(
        !chain.contains("@closed"),
        "the default policy's rules are still in place: {chain}"
    );

    // Pool sandboxes survive a restart and are claimed after it.
    let mut s = s;
    s.restart();
    wait_for(&s, "xs", "fast_ready");
    let after = s.create(json!({ "size": "xs" }));
    assert_eq!(s.sh(&after, "echo ok")["stdout"], "ok\n");
}

#[test]
fn a_clean_stop_removes_the_pool_and_keeps_users_sandboxes() {
    let mut s = Server::start_with("[pool]\ndefault = 0\nsizes = { xs = 2 }\n");
    wait_for(&s, "xs", "fast_ready");
    let mine = s.create(json!({ "size": "small" }));
    let instance = std::fs::read_to_string(s.data_dir().join("instance-id")).unwrap();
    let sandboxes_of_instance = || {
        let mut n = 0;
        if let Ok(rd) = std::fs::read_dir(format!("/sys/fs/cgroup/pids/cella/{}", instance.trim()))
        {
            for e in rd.flatten() {
                if e.path().is_dir()
                    && !std::fs::read_to_string(e.path().join("cgroup.procs"))
                        .unwrap_or_default()
                        .trim()
                        .is_empty()
                {
                    n += 1;
                }
            }
        }
        n
    };
    if std::path::Path::new("/sys/fs/cgroup/pids/cella").exists() {
        assert_eq!(
            sandboxes_of_instance(),
            3,
            "two pool sandboxes and the user's"
        );
    }
    s.stop();
    // The user's sandbox runs on; the pool is gone.
    assert!(!sandbox_pids(&mine).is_empty());
    if std::path::Path::new("/sys/fs/cgroup/pids/cella").exists() {
        assert_eq!(sandboxes_of_instance(), 1, "the pool outlived a clean stop");
    }
    s.restart();
    assert_eq!(s.sh(&mine, "echo still here")["stdout"], "still here\n");
    wait_for(&s, "xs", "fast_ready");
}
