//! Real sandboxes end to end: lifecycle, exec semantics, isolation, limits, and cleanup.

mod common;
use common::{cgroup_dirs, eventually, namespaces, namespaces_in_use, sandbox_pids, Server};
use serde_json::json;
use std::time::{Duration, Instant};

const SEED_FIELDS: [&str; 23] = [
    "id",
    "tenant_id",
    "owner_id",
    "template_id",
    "state",
    "size",
    "resource_contract",
    "cpu_count",
    "memory_mb",
    "disk_size_mb",
    "ready",
    "ready_at",
    "preview_url",
    "timeout_sec",
    "timeout_remaining_ms",
    "always_on",
    "persistent",
    "idle_timeout_sec",
    "total_runtime_sec",
    "metadata",
    "created_at",
    "started_at",
    "destroyed_at",
];

#[test]
fn create_exec_destroy_with_the_full_sandbox_object() {
    let s = Server::start();
    let r = s.post(
        "/api/v1/sandboxes",
        json!({ "metadata": { "job": "t1" }, "timeout_sec": 600 }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let sb = r.data().clone();
    for f in SEED_FIELDS {
        assert!(sb.get(f).is_some(), "field {f} missing");
    }
    assert_eq!(sb["state"], "running");
    assert_eq!(sb["ready"], true);
    assert_eq!(sb["template_id"], "base");
    assert_eq!(sb["size"], "small");
    assert_eq!(
        (
            sb["cpu_count"].as_u64(),
            sb["memory_mb"].as_u64(),
            sb["disk_size_mb"].as_u64()
        ),
        (Some(2), Some(4096), Some(10240))
    );
    assert_eq!(sb["resource_contract"]["contract_id"], "sandbox/small@v1");
    assert_eq!(sb["metadata"], json!({ "job": "t1" }));
    assert_eq!(sb["persistent"], true);
    assert_eq!(sb["always_on"], false);
    assert_eq!(sb["timeout_sec"], 600);
    // The default workspace was made today: the 30-minute idle default applies.
    assert_eq!(sb["idle_timeout_sec"], 1800);
    let remaining = sb["timeout_remaining_ms"].as_i64().unwrap();
    assert!(remaining > 590_000 && remaining <= 600_000);
    assert!(sb["total_runtime_sec"].is_null() && sb["destroyed_at"].is_null());
    assert!(sb["ready_at"].is_string() && sb["started_at"].is_string());
    assert!(sb["created_at"].as_str().unwrap().ends_with('Z'));
    let id = sb["id"].as_str().unwrap();
    assert!(id.len() <= 40 && id.chars().next().unwrap().is_ascii_lowercase());
    assert!(id
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));

    let out = s.sh(id, "echo hello");
    assert_eq!(out["exit_code"], 0);
    assert_eq!(out["stdout"], "hello\n");
    assert_eq!(out["stderr"], "");
    assert_eq!(out["timed_out"], false);
    assert!(out["duration_ms"].is_u64());

    let got = s.get(&format!("/api/v1/sandboxes/{id}"));
    assert_eq!(got.data()["id"], id);
    std::thread::sleep(Duration::from_millis(1100));
    let d = s.delete(&format!("/api/v1/sandboxes/{id}"));
    assert_eq!(d.status, 200);
    assert_eq!(d.data()["state"], "destroyed");
    assert!(d.data()["destroyed_at"].is_string());
    assert!(d.data()["total_runtime_sec"].as_i64().unwrap() >= 1);
    assert!(d.data()["timeout_remaining_ms"].is_null());
    // Idempotent, and still readable.
    let again = s.delete(&format!("/api/v1/sandboxes/{id}"));
    assert_eq!(again.status, 200);
    assert_eq!(again.data()["destroyed_at"], d.data()["destroyed_at"]);
    assert_eq!(
        s.get(&format!("/api/v1/sandboxes/{id}")).data()["state"],
        "destroyed"
    );
    let e = s.post(
        &format!("/api/v1/sandboxes/{id}/exec"),
        json!({ "command": "true" }),
    );
    e.assert_error(409, "SANDBOX_NOT_RUNNING");
}

#[test]
fn wait_false_answers_provisioning_then_runs() {
    let s = Server::start();
    let r = s.post("/api/v1/sandboxes", json!({ "size": "xs", "wait": false }));
    assert_eq!(r.status, 202);
    assert_eq!(r.data()["state"], "provisioning");
    assert_eq!(r.data()["ready"], false);
    assert!(
        r.data()["timeout_remaining_ms"].is_null(),
        "null before start"
    );
    let id = r.data()["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let g = s.get(&format!("/api/v1/sandboxes/{id}"));
        if g.data()["state"] == "running" {
            assert_eq!(g.data()["ready"], true);
            break;
        }
        assert_eq!(g.data()["state"], "provisioning");
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(s.sh(&id, "echo up")["stdout"], "up\n");
}

#[test]
fn exec_takes_argv_stdin_env_cwd_user_and_passes_exit_codes() {
    let s = Server::start();
    let id =
        s.create(json!({ "size": "xs", "env": { "FROM_CREATE": "c1", "SHADOWED": "create" } }));
    let r = s.exec(&id, json!({ "argv": ["printf", "%s-%s", "a b", "c"] }));
    assert_eq!(r["stdout"], "a b-c");
    assert_eq!(
        s.exec(&id, json!({ "command": "cat", "stdin": "from stdin\n" }))["stdout"],
        "from stdin\n"
    );
    let env = s.exec(&id, json!({ "command": "echo $FROM_CREATE $SHADOWED $HOME $USER", "env": { "SHADOWED": "request" } }));
    assert_eq!(env["stdout"], "c1 request /home/user user\n");
    assert_eq!(
        s.exec(&id, json!({ "command": "pwd" }))["stdout"],
        "/home/user\n"
    );
    assert_eq!(
        s.exec(&id, json!({ "command": "pwd", "cwd": "/tmp" }))["stdout"],
        "/tmp\n"
    );
    assert_eq!(
        s.exec(&id, json!({ "command": "id -u" }))["stdout"],
        "1000\n"
    );
    let root = s.exec(
        &id,
        json!({ "command": "id -u; echo $HOME; pwd", "user": "root" }),
    );
    assert_eq!(root["stdout"], "0\n/root\n/root\n");
    let code = s.exec(&id, json!({ "command": "echo out; echo err >&2; exit 3" }));
    assert_eq!(
        (
            code["exit_code"].as_i64(),
            code["stdout"].as_str(),
            code["stderr"].as_str()
        ),
        (Some(3), Some("out\n"), Some("err\n"))
    );
    let missing = s.exec(&id, json!({ "argv": ["no-such-program"] }));
    assert_eq!(missing["exit_code"], 127);
    assert!(missing["stderr"]
        .as_str()
        .unwrap()
        .contains("no-such-program"));
    // A file that is not a program: the shell's 126 and why.
    let denied = s.exec(&id, json!({ "argv": ["/etc/hostname"] }));
    assert_eq!(denied["exit_code"], 126, "{denied}");
    assert!(denied["stderr"]
        .as_str()
        .unwrap()
        .contains("/etc/hostname: permission denied"));
    // The unprivileged user cannot write where root owns.
    assert_ne!(s.sh(&id, "touch /etc/x")["exit_code"], 0);
    // /usr: the user cannot write it; root changes only its own sandbox's view, never the host's.
    assert_ne!(s.sh(&id, "touch /usr/bin/evil")["exit_code"], 0);
    let own = s.exec(
        &id,
        json!({ "command": "echo mine > /usr/bin/cella-test-evil && cat /usr/bin/cella-test-evil", "user": "root" }),
    );
    assert_eq!(own["stdout"], "mine\n", "{own}");
    assert!(!std::path::Path::new("/usr/bin/cella-test-evil").exists());
    let other = s.create(json!({ "size": "xs" }));
    assert_ne!(
        s.sh(&other, "test -e /usr/bin/cella-test-evil")["exit_code"],
        0
    );

    let p = format!("/api/v1/sandboxes/{id}/exec");
    let bad_cwd = s.post(&p, json!({ "command": "pwd", "cwd": "/does/not/exist" }));
    bad_cwd.assert_error(400, "INVALID_REQUEST");
    assert_eq!(bad_cwd.body["error"]["details"]["field"], "cwd");
    s.post(&p, json!({ "command": "pwd", "cwd": "relative" }))
        .assert_error(400, "INVALID_REQUEST");
    s.post(&p, json!({})).assert_error(400, "INVALID_REQUEST");
    s.post(&p, json!({ "command": "x", "argv": ["x"] }))
        .assert_error(400, "INVALID_REQUEST");
    s.post(&p, json!({ "argv": [] }))
        .assert_error(400, "INVALID_REQUEST");
    s.post(&p, json!({ "command": "true", "timeout_sec": 0 }))
        .assert_error(400, "INVALID_REQUEST");
    s.post(&p, json!({ "command": "true", "user": "admin" }))
        .assert_error(400, "INVALID_REQUEST");
}

#[test]
fn a_timed_out_command_and_its_children_are_killed() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let started = Instant::now();
    let r = s.exec(&id, json!({ "command": "sleep 300 & setsid sleep 301 & echo started; sleep 302", "timeout_sec": 1 }));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(r["timed_out"], true);
    assert_eq!(r["exit_code"], 137);
    assert_eq!(r["stdout"], "started\n");
    std::thread::sleep(Duration::from_millis(200));
    let ps = s.sh(&id, "ps -eo args | grep -c '^sleep 30' || true");
    assert_eq!(ps["stdout"], "0\n", "children survived the timeout");
}

#[test]
fn output_past_the_cap_is_cut_and_flagged() {
    let s = Server::start_with("[exec]\noutput_cap_bytes = 1000\n");
    let id = s.create(json!({ "size": "xs" }));
    let r = s.sh(&id, "head -c 5000 /dev/zero | tr '\\0' a; echo tail >&2");
    assert_eq!(r["stdout"].as_str().unwrap().len(), 1000);
    assert_eq!(r["stdout_truncated"], true);
    assert_eq!(r["stderr"], "tail\n");
    assert_eq!(r["stderr_truncated"], false);
    assert_eq!(r["exit_code"], 0);
}

#[test]
fn files_persist_across_execs_but_not_across_sandboxes() {
    let s = Server::start();
    let a = s.create(json!({ "size": "xs" }));
    let b = s.create(json!({ "size": "xs" }));
    assert_eq!(
        s.sh(
            &a,
            "echo secret-a > /home/user/note && echo marker-a-77 > /tmp/marker-a-77"
        )["exit_code"],
        0
    );
    assert_eq!(s.sh(&a, "cat /home/user/note")["stdout"], "secret-a\n");
    let other = s.sh(
        &b,
        "cat /home/user/note; find / -xdev -name 'marker-a-77' 2>/dev/null",
    );
    assert_ne!(other["exit_code"], 0);
    assert_eq!(other["stdout"], "");
}

#[test]
fn the_host_is_not_visible_inside() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let data = s.data_dir().display().to_string();
    let checks = format!(
        "test -e /etc/shadow && echo shadow; ls -A /root; ls -A /home; test -e '{data}' && echo datadir; \
         find / -xdev -name cella.db 2>/dev/null; hostname; cat /etc/hostname"
    );
    let r = s.exec(&id, json!({ "command": checks, "user": "root" }));
    assert_eq!(
        r["stdout"],
        format!("user\n{id}\n{id}\n"),
        "stderr: {}",
        r["stderr"]
    );
    let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_ne!(host_name.trim(), id);
    // Its own PID namespace: a handful of processes, PID 1 is the sandbox's init, no server.
    let ps = s.exec(&id, json!({ "command": "ls /proc | grep -E '^[0-9]+$' | wc -l; cat /proc/1/cmdline | tr '\\0' ' '", "user": "root" }));
    let out = ps["stdout"].as_str().unwrap();
    let count: u32 = out.lines().next().unwrap().trim().parse().unwrap();
    assert!(count < 8, "sees {count} processes: {out}");
    assert!(!out.contains("serve") && !out.contains(&data), "{out}");
    assert!(!s.sh(
        &id,
        &format!("cat /proc/{}/cmdline 2>/dev/null", s.server_pid())
    )["stdout"]
        .as_str()
        .unwrap()
        .contains("serve"));
    // Its own network namespace: loopback and its own end of its link, none of the host's.
    let net = s.sh(&id, "ls /sys/class/net");
    assert_eq!(net["stdout"], "eth0\nlo\n");
}

#[test]
fn a_memory_hog_is_killed_inside_and_only_there() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let neighbour = s.create(json!({ "size": "xs" }));
    // xs has 1024 MiB; this wants 1500 MiB of touched memory.
    let hog = s.sh(
        &id,
        "python3 -c \"x = 'a' * (1500 * 1024 * 1024); print(len(x))\"",
    );
    assert_eq!(hog["exit_code"], 137, "{hog}");
    assert_eq!(hog["stdout"], "");
    // The sandbox itself, its neighbour and the server carry on.
    assert_eq!(s.sh(&id, "echo alive")["stdout"], "alive\n");
    assert_eq!(s.sh(&neighbour, "echo fine")["stdout"], "fine\n");
    assert_eq!(s.req("GET", "/healthz", None, None).status, 200);
}

#[test]
fn destroy_leaves_nothing_on_the_host() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    s.sh(&id, "sleep 1000 >/dev/null 2>&1 & echo x > /tmp/f");
    let pids = sandbox_pids(&id);
    assert!(pids.len() >= 2, "init and the sleeper: {pids:?}");
    let ns = namespaces(pids[0]);
    assert_eq!(ns.len(), 7);
    // Every namespace of the sandbox is its own.
    let mine = namespaces(std::process::id() as i32);
    assert!(ns.iter().all(|n| !mine.contains(n)), "{ns:?} vs {mine:?}");
    assert!(!cgroup_dirs(&id).is_empty());
    let dir = s.data_dir().join("sandboxes").join(&id);
    assert!(
        dir.join("disk.img").exists(),
        "the writable layer lives under the data dir, in the sandbox's own disk image"
    );

    let d = s.delete(&format!("/api/v1/sandboxes/{id}"));
    assert_eq!(d.data()["state"], "destroyed", "{}", d.body);
    // The answer comes once the row is destroyed; the teardown on the host follows it.
    eventually("the sandbox's processes end", || {
        pids.iter()
            .all(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
    });
    eventually("the sandbox's namespaces are let go", || {
        let in_use = namespaces_in_use();
        ns.iter().all(|n| !in_use.contains(n))
    });
    eventually("its cgroups, directory and socket are removed", || {
        cgroup_dirs(&id).is_empty()
            && !dir.exists()
            && !s.data_dir().join("run").join(format!("{id}.sock")).exists()
    });
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&id));
    let loops = std::process::Command::new("losetup")
        .arg("-a")
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&loops.stdout).contains(&id),
        "a loop device is left"
    );
}

#[test]
fn a_killed_server_restarts_and_finds_every_sandbox() {
    let mut s = Server::start();
    let alive = s.create(json!({ "size": "xs" }));
    let doomed = s.create(json!({ "size": "xs" }));
    let doomed_temp = s.create(json!({ "size": "xs", "persistent": false }));
    let destroyed = s.create(json!({ "size": "xs" }));
    s.delete(&format!("/api/v1/sandboxes/{destroyed}"));
    s.sh(
        &alive,
        "echo kept > /home/user/state; sleep 1000 >/dev/null 2>&1 &",
    );
    s.sh(&doomed, "echo survives > /home/user/state");
    s.kill9();
    // The sandboxes do not die with the server; now two of them die while it is down.
    assert!(!sandbox_pids(&alive).is_empty());
    for id in [&doomed, &doomed_temp] {
        let pids = sandbox_pids(id);
        assert!(!pids.is_empty());
        for p in &pids {
            unsafe { libc::kill(*p, libc::SIGKILL) };
        }
    }
    s.restart();
    let all = s.get("/api/v1/sandboxes?state=all");
    let state = |id: &str| {
        all.data()
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(state(&alive)["state"], "running");
    assert_eq!(state(&destroyed)["state"], "destroyed");
    // Reported honestly: a persistent sandbox keeps its files and can be resumed...
    let d = state(&doomed);
    assert_eq!(d["state"], "stopped");
    assert!(d["state_reason"].as_str().unwrap().contains("gone"), "{d}");
    // ...a non-persistent one has nothing to keep.
    let t = state(&doomed_temp);
    assert_eq!(t["state"], "error");
    assert!(t["state_reason"].as_str().unwrap().contains("gone"), "{t}");
    assert!(!s.data_dir().join("sandboxes").join(&doomed_temp).exists());
    // The live one kept its files and its processes.
    assert_eq!(
        s.sh(&alive, "cat /home/user/state; pgrep -c sleep")["stdout"],
        "kept\n1\n"
    );
    // Nothing of the dead ones is left running or in cgroups.
    assert!(cgroup_dirs(&doomed).is_empty() && cgroup_dirs(&doomed_temp).is_empty());
    let r = s.post(&format!("/api/v1/sandboxes/{doomed}/resume"), json!({}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        s.sh(&doomed, "cat /home/user/state")["stdout"],
        "survives\n"
    );
    assert_eq!(
        s.delete(&format!("/api/v1/sandboxes/{doomed_temp}")).data()["state"],
        "destroyed"
    );
}

#[test]
fn a_sandbox_that_dies_under_a_running_server_is_reported() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    s.sh(&id, "echo mine > /home/user/f");
    for p in sandbox_pids(&id) {
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    std::thread::sleep(Duration::from_millis(100));
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/exec"),
        json!({ "command": "true" }),
    );
    r.assert_error(409, "SANDBOX_NOT_RUNNING");
    let g = s.get(&format!("/api/v1/sandboxes/{id}"));
    assert_eq!(g.data()["state"], "stopped");
    assert!(g.data()["state_reason"].as_str().unwrap().contains("gone"));
    assert!(cgroup_dirs(&id).is_empty());
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{id}/resume"), json!({}))
            .status,
        200
    );
    assert_eq!(s.sh(&id, "cat /home/user/f")["stdout"], "mine\n");
}

#[test]
fn init_reaps_orphans() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    // The subshell exits at once; its sleeper is orphaned to PID 1 and exits later.
    s.sh(&id, "(sleep 0.2 >/dev/null 2>&1 &) ; true");
    std::thread::sleep(Duration::from_millis(600));
    let z = s.exec(
        &id,
        json!({ "command": "ps -eo stat= | grep -c '^Z' || true", "user": "root" }),
    );
    assert_eq!(z["stdout"], "0\n", "zombies left");
}

#[test]
fn cgroup_limits_follow_the_size() {
    let s = Server::start();
    let id = s.create(json!({ "size": "small" }));
    let mem = common::cgroup_value(&id, ("memory", "memory.limit_in_bytes"), "memory.max")
        .expect("memory limit");
    assert_eq!(mem, (4096u64 * 1024 * 1024).to_string());
    let cpu = common::cgroup_value(&id, ("cpu", "cpu.cfs_quota_us"), "cpu.max").expect("cpu quota");
    assert!(cpu == "200000" || cpu.starts_with("200000 "), "{cpu}");
    let pids = common::cgroup_value(&id, ("pids", "pids.max"), "pids.max").expect("pids limit");
    // 1024 per vCPU, lowered so that pids x [limits] open_files (1024) stays within
    // open_files_host_percent (10) of the host's fs.file-max, but never below 128.
    let file_max: u64 = std::fs::read_to_string("/proc/sys/fs/file-max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let want = 2048u64.min((file_max * 10 / 100 / 1024).max(128));
    assert_eq!(pids, want.to_string());
    // No swap beyond memory: memory+swap equals memory on v1, swap is 0 on v2 (where the kernel
    // accounts swap at all).
    if let Some(swap) = common::cgroup_value(
        &id,
        ("memory", "memory.memsw.limit_in_bytes"),
        "memory.swap.max",
    ) {
        assert!(
            swap == (4096u64 * 1024 * 1024).to_string() || swap == "0",
            "{swap}"
        );
    }
    // Inside, the sandbox sees its cgroup as the root of its own cgroup namespace; an exec's
    // processes are in its own group below it (the freezer hierarchy's on v1).
    let cg = s.sh(&id, "cat /proc/self/cgroup");
    let lines: Vec<&str> = cg["stdout"].as_str().unwrap().lines().collect();
    for line in &lines {
        // v1 (a hybrid host may list an empty unified hierarchy too): the freezer; v2: the one line.
        let exec_group =
            line.contains(":freezer:") || (lines.len() == 1 && line.starts_with("0::"));
        if exec_group {
            let rest = line.rsplit(':').next().unwrap_or_default();
            assert!(rest.starts_with("/exec-"), "{line}");
        } else {
            assert!(line.ends_with(":/"), "{line}");
        }
    }
}

#[test]
fn the_disk_quota_gives_enospc_inside_and_frees_space_again() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let neighbour = s.create(json!({ "size": "xs" }));
    // The sandbox's root file system has the size of its contract (4096 MiB for xs).
    let df = s.sh(&id, "df -m --output=size / | tail -1");
    let size: u64 = df["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!((3800..=4096).contains(&size), "{df}");
    // Past the quota: ENOSPC inside.
    let over = s.sh(&id, "fallocate -l 5G /home/user/big");
    assert_ne!(over["exit_code"], 0);
    assert!(
        over["stderr"].as_str().unwrap().contains("No space left"),
        "{over}"
    );
    let fill = s.sh(&id, "fallocate -l 3900M /home/user/big && dd if=/dev/zero of=/home/user/more bs=1M count=400 2>&1");
    assert_ne!(fill["exit_code"], 0);
    assert!(
        fill["stdout"].as_str().unwrap().contains("No space left"),
        "{fill}"
    );
    // The neighbour is unaffected, and so is the host (the image is sparse: its data stays small).
    assert_eq!(
        s.sh(
            &neighbour,
            "dd if=/dev/zero of=/tmp/x bs=1M count=100 2>/dev/null && echo ok"
        )["stdout"],
        "ok\n"
    );
    let img = s.data_dir().join("sandboxes").join(&id).join("disk.img");
    let used = std::process::Command::new("du")
        .args(["-m", "--apparent-size"])
        .arg(&img)
        .output()
        .unwrap();
    let real = std::process::Command::new("du")
        .arg("-m")
        .arg(&img)
        .output()
        .unwrap();
    let real_mb: u64 = String::from_utf8_lossy(&real.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        real_mb < 1024,
        "the image takes {real_mb} MiB on the host ({})",
        String::from_utf8_lossy(&used.stdout)
    );
    // Deleting files frees the space again.
    let again = s.sh(&id, "rm /home/user/big /home/user/more && dd if=/dev/zero of=/home/user/more bs=1M count=400 2>/dev/null && sync && echo ok");
    assert_eq!(again["stdout"], "ok\n", "{again}");
    // Those 400 MiB went to the image with direct I/O: they do not also sit in the host's page
    // cache (where a kernel cannot do direct I/O for the image, the device runs buffered).
    let run = |cmd: &str, args: &[&str]| {
        let o = std::process::Command::new(cmd).args(args).output().unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let img_path = img.to_str().unwrap();
    let dev = run("losetup", &["-n", "-O", "NAME", "-j", img_path]);
    let dio = std::fs::read_to_string(format!(
        "/sys/block/{}/loop/dio",
        dev.trim_start_matches("/dev/")
    ))
    .unwrap_or_default();
    if dio.trim() == "1" {
        let cached: u64 = run("fincore", &["-b", "-n", "-o", "RES", img_path])
            .parse()
            .unwrap();
        assert!(
            cached < 64 << 20,
            "{} MiB of the sandbox's disk are in the host's page cache",
            cached >> 20
        );
    } else {
        eprintln!("the loop device {dev:?} runs buffered here (dio {dio:?})");
    }
    // Files survive a stop and resume on their own file system.
    s.sh(&id, "echo kept > /home/user/note");
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{id}/stop"), json!({}))
            .status,
        200
    );
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{id}/resume"), json!({}))
            .status,
        200
    );
    assert_eq!(s.sh(&id, "cat /home/user/note")["stdout"], "kept\n");
    // Destroy leaves no loop device behind (the teardown runs after the answer).
    assert_eq!(s.delete(&format!("/api/v1/sandboxes/{id}")).status, 200);
    common::eventually("the destroyed sandbox's loop device is detached", || {
        let loops = std::process::Command::new("losetup")
            .arg("-a")
            .output()
            .unwrap();
        !String::from_utf8_lossy(&loops.stdout).contains(&id)
    });
}

/// The cgroup mounts of the host: mount point, the mount's options, and the hierarchy's options
/// less `favordynmods`.
fn cgroup_mounts() -> (Vec<(String, String, String)>, bool) {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut on = false;
    let mut mounts = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if !r[0].starts_with("cgroup") {
            continue;
        }
        let opts: Vec<&str> = r[2].split(',').collect();
        on |= opts.contains(&"favordynmods");
        let kept: Vec<&str> = opts.into_iter().filter(|o| *o != "favordynmods").collect();
        mounts.push((l[4].to_string(), l[5].to_string(), kept.join(",")));
    }
    (mounts, on)
}

#[test]
fn a_start_turns_on_favordynmods_and_changes_nothing_else_of_the_cgroup_mounts() {
    let (before, was_on) = cgroup_mounts();
    assert!(!before.is_empty(), "no cgroup mount on this host");
    let s = Server::start();
    let (after, on) = cgroup_mounts();
    assert!(
        on,
        "no cgroup hierarchy shows favordynmods after a start: {after:?}\n{}",
        s.log()
    );
    // The remount kept every hierarchy's own options (nsdelegate and the like) and the
    // mounts' flags (nosuid, nodev, noexec, atime).
    assert_eq!(before, after, "a start changed the cgroup mounts");
    // Sandboxes boot and run with it, and the server said what it found.
    let id = s.create(json!({ "size": "xs" }));
    let out = s.sh(&id, "cat /proc/self/cgroup >/dev/null && echo ran");
    assert_eq!(out["stdout"], "ran\n");
    // ... and which case it met: on already, or turned on by this start.
    let said = if was_on {
        "cgroup favordynmods: on already"
    } else {
        "cgroup favordynmods: turned on"
    };
    eventually("the server to say what it did with favordynmods", || {
        s.log().contains(said)
    });
    assert!(
        !s.log().contains("favordynmods is not available"),
        "{}",
        s.log()
    );
    s.delete(&format!("/api/v1/sandboxes/{id}"));
    // Told not to, a server leaves the host alone and says nothing of it.
    let quiet = Server::start_with("[host]\ncgroup_favordynmods = false\n");
    let id = quiet.create(json!({ "size": "xs" }));
    quiet.delete(&format!("/api/v1/sandboxes/{id}"));
    assert!(!quiet.log().contains("favordynmods"), "{}", quiet.log());
    assert_eq!(cgroup_mounts().0, before);
}

/// Launchers waiting ahead (`common::waiting_launcher`) whose parent is `ppid`. (A sandbox's PID 1
/// becomes the agent without an exec and keeps the launcher's command line; once its launcher
/// exited its parent is the server, but it is in its sandbox's cgroups.)
fn launchers_of(ppid: u32) -> Vec<u32> {
    common::children_of(ppid as i32)
        .into_iter()
        .filter(|p| common::waiting_launcher(*p))
        .map(|p| p as u32)
        .collect()
}

#[test]
fn a_launcher_waits_ahead_for_the_next_boot_and_none_outlives_a_killed_server() {
    let mut s = Server::start();
    let server = s.server_pid();
    let ready = || {
        let mut found = Vec::new();
        eventually("a launcher waiting ahead", || {
            found = launchers_of(server);
            found.len() == 1
        });
        found[0]
    };
    let first = ready();
    // It waits with nothing of the server's: no environment, no sandbox cgroup.
    let environ = std::fs::read(format!("/proc/{first}/environ")).unwrap();
    assert!(environ.is_empty(), "{}", String::from_utf8_lossy(&environ));
    let own = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert_eq!(
        own(first),
        own(server),
        "a waiting launcher is in the server's cgroup"
    );
    // A boot takes it: the sandbox runs, its setup log was written by the launcher, and the
    // next one is started behind it.
    let id = s.create(json!({ "size": "xs" }));
    assert_eq!(s.sh(&id, "echo up")["stdout"], "up\n");
    let log =
        std::fs::read_to_string(s.data_dir().join(format!("sandboxes/{id}/init.log"))).unwrap();
    assert!(log.contains("cella-launch: userns="), "{log}");
    eventually("the launcher that booted the sandbox to be gone", || {
        !launchers_of(server).contains(&first)
    });
    let second = ready();
    assert_ne!(second, first);
    let alive = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|st| !st.contains(") Z "))
            .unwrap_or(false)
    };
    // One killed from outside while it waited is not handed to a boot: the next create starts
    // another and succeeds. (Once it has died: `kill` returns before the process has ended,
    // and a boot that takes one still dying fails with no answer from it.)
    unsafe { libc::kill(second as i32, libc::SIGKILL) };
    eventually("the killed launcher to have ended", || !alive(second));
    let b = s.create(json!({ "size": "xs" }));
    assert_eq!(s.sh(&b, "echo up")["stdout"], "up\n");
    let third = ready();
    assert_ne!(third, second);
    // `kill -9` of the server: the waiting launcher sees its input close and exits.
    s.kill9();
    eventually("the waiting launcher to exit with its server", || {
        !alive(third)
    });
    // The sandboxes outlived it, and the next start finds them running.
    s.restart();
    assert_eq!(s.sh(&id, "echo still")["stdout"], "still\n");
    for sb in [&id, &b] {
        s.delete(&format!("/api/v1/sandboxes/{sb}"));
    }
}

/// Runs `cella __sandbox-init` by hand: writes `input`, closes its stdin, returns its answer.
fn launcher_answer(input: &str) -> serde_json::Value {
    use std::io::Write;
    let mut c = std::process::Command::new(common::bin())
        .arg("__sandbox-init")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(!out.status.success(), "a refused start exits non-zero");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn a_launcher_refuses_a_bad_start_or_a_configuration_for_another_sandbox_and_says_why() {
    // A start that is no start.
    let a = launcher_answer("not json\n");
    assert_eq!(a["ok"], false);
    let err = a["error"].as_str().unwrap();
    assert!(err.starts_with("parsing the launcher's start"), "{err}");
    // A setup log it cannot open: named, and nothing joined or made.
    let dir = tempfile::tempdir().unwrap();
    let start = |id: &str, log: &std::path::Path| {
        json!({ "id": id, "cgroup": "", "log": log, "userns": null, "network": null }).to_string()
    };
    let a = launcher_answer(&format!(
        "{}\n",
        start("sbone", &dir.path().join("no/such/dir/init.log"))
    ));
    let err = a["error"].as_str().unwrap();
    assert!(err.starts_with("opening the setup log"), "{err}");
    // A configuration that names another sandbox than its start: refused before anything is
    // built (no fork, no mount), and said in the answer.
    let log = dir.path().join("init.log");
    let cfg = json!({
        "id": "sbother", "hostname": "sbother", "layers": [], "upper": dir.path().join("u"),
        "work": dir.path().join("w"), "rootfs": dir.path().join("r"), "binds": [],
        "socket": dir.path().join("s.sock"), "cgroup": ""
    });
    let a = launcher_answer(&format!("{}\n{cfg}", start("sbone", &log)));
    assert_eq!(
        a["error"], "the launch configuration is not the one its start named",
        "{a}"
    );
    assert!(!dir.path().join("s.sock").exists());
    assert!(!dir.path().join("r").exists());
}
