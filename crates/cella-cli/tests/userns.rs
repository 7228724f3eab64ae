//! User namespaces: a sandbox's root is an unprivileged uid range on the host, the files it
//! writes belong to that range, and the sandbox still looks and works like a normal machine
//! (its files owned by root, root able to change /etc and /usr, ports below 1024 bindable).
//! Sandboxes made before user namespaces keep their files; template layers hold ids from 0.

mod common;

use common::*;
use serde_json::json;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The default range: ids 0..65536 inside are 1000000000.. on the host.
const BASE: u32 = 1_000_000_000;

fn root(s: &Server, id: &str, command: &str) -> serde_json::Value {
    let out = s.exec(id, json!({ "command": command, "user": "root" }));
    assert_eq!(out["exit_code"], 0, "{out}");
    out
}

/// The uid of a host process (real, effective, saved, fs).
fn host_uids(pid: i32) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap())
        .collect()
}

/// A path inside the sandbox, as the host reaches it (through its init's root).
fn from_host(id: &str, path: &str) -> PathBuf {
    let init = sandbox_pids(id)[0];
    Path::new(&format!("/proc/{init}/root")).join(path.trim_start_matches('/'))
}

fn owner(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (m.uid(), m.gid())
}

#[test]
fn root_in_a_sandbox_is_an_unprivileged_range_on_the_host() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    // Inside: root, and the sandbox's files look as on any machine.
    let out = root(
        &s,
        &id,
        "id -u; cat /proc/self/uid_map /proc/self/gid_map; \
         stat -c '%n %U:%G' / /etc /etc/passwd /usr /usr/bin/env /tmp /run /dev /dev/null /home/user",
    );
    let text = out["stdout"].as_str().unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "0");
    for map in &lines[1..3] {
        let f: Vec<&str> = map.split_whitespace().collect();
        assert_eq!(f, ["0", &BASE.to_string(), "65536"], "{text}");
    }
    for l in &lines[3..] {
        let want = if l.starts_with("/home/user ") {
            "user:user"
        } else {
            "root:root"
        };
        assert!(l.ends_with(want), "{l} (want {want})");
    }
    // Root can change the template's files (/etc, and /usr over the host's), the user its own;
    // both can listen on ports below 1024.
    root(
        &s,
        &id,
        "echo added > /etc/added.conf && echo tool > /usr/local/bin/tool && \
         python3 -c 'import socket; socket.socket().bind((\"0.0.0.0\", 80))'",
    );
    let user = s.sh(
        &id,
        "echo mine > ~/mine.txt && python3 -c 'import socket; socket.socket().bind((\"0.0.0.0\", 443))' && echo ok",
    );
    assert_eq!(user["stdout"], "ok\n", "{user}");

    // On the host: the sandbox's processes run as the range's ids, never as root.
    let p = s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "command": "sleep 600" }),
    );
    assert_eq!(p.status, 201, "{}", p.body);
    let pids = sandbox_pids(&id);
    assert!(pids.len() >= 2, "{pids:?}");
    // The namespace belongs to one of the accounting uids just above the range.
    let ns = std::fs::File::open(format!("/proc/{}/ns/user", pids[0])).unwrap();
    let mut ns_owner: libc::uid_t = 0;
    // SAFETY: NS_GET_OWNER_UID writes one uid_t to the pointer.
    let r = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&ns),
            0xb704, // NS_GET_OWNER_UID
            &mut ns_owner as *mut libc::uid_t,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    let setup_log =
        std::fs::read_to_string(s.data_dir().join("sandboxes").join(&id).join("init.log")).unwrap();
    // Root only where the host refuses other owners, which the setup log then says.
    if ns_owner != 0 || !setup_log.contains("the host's root makes it instead") {
        assert!(
            (BASE + 65536..BASE + 2 * 65536).contains(&ns_owner),
            "the user namespace's owner {ns_owner}"
        );
    }
    // The server tells its launchers the id map as they start: the namespace was made while
    // the launcher waited, not on the boot's path.
    assert!(setup_log.contains("(namespace made ahead)"), "{setup_log}");
    let mut seen_user = false;
    for pid in &pids {
        let uids = host_uids(*pid);
        assert!(uids.iter().all(|u| *u >= BASE), "pid {pid}: {uids:?}");
        seen_user |= uids == [BASE + 1000; 4];
    }
    assert_eq!(
        host_uids(pids[0]),
        [BASE; 4],
        "the sandbox's init (the agent)"
    );
    // The agent is still the OOM killer's last pick (set before it entered the namespace):
    // where the server may lower scores (CAP_SYS_RESOURCE, bit 24, which some hosts' root lacks).
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    let score = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", pids[0])).unwrap();
    let want = if cap_eff & (1 << 24) != 0 {
        "-1000"
    } else {
        "0"
    };
    assert_eq!(score.trim(), want);
    assert!(seen_user, "the user's sleep runs as {}", BASE + 1000);
    // ... and the files it writes belong to the range.
    assert_eq!(owner(&from_host(&id, "/etc/added.conf")), (BASE, BASE));
    assert_eq!(owner(&from_host(&id, "/usr/local/bin/tool")), (BASE, BASE));
    assert_eq!(
        owner(&from_host(&id, "/home/user/mine.txt")),
        (BASE + 1000, BASE + 1000)
    );
    // The host's /usr was not written.
    assert!(!Path::new("/usr/local/bin/tool").exists());
}

#[test]
fn sandboxes_from_before_user_namespaces_keep_their_files() {
    let mut s = Server::start_with("[isolation]\nuserns = false\n");
    let id = s.create(json!({ "size": "xs" }));
    root(
        &s,
        &id,
        "echo conf > /etc/old.conf && echo bin > /usr/local/bin/old",
    );
    s.sh(&id, "echo note > ~/old.txt && chmod 600 ~/old.txt");
    assert_eq!(owner(&from_host(&id, "/home/user/old.txt")), (1000, 1000));
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{id}/stop"), json!({}))
            .status,
        200
    );

    // The server comes back with user namespaces (the default); the sandbox boots again.
    let config = s.dir.path().join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("userns = false", "")).unwrap();
    s.restart();
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{id}/resume"), json!({}))
            .status,
        200
    );
    let out = s.sh(
        &id,
        "cat ~/old.txt && echo more >> ~/old.txt && stat -c '%U %a' ~/old.txt /etc/old.conf /usr/local/bin/old",
    );
    assert_eq!(
        out["stdout"], "note\nuser 600\nroot 644\nroot 644\n",
        "{out}"
    );
    assert_eq!(
        owner(&from_host(&id, "/home/user/old.txt")),
        (BASE + 1000, BASE + 1000)
    );
    assert_eq!(owner(&from_host(&id, "/etc/old.conf")), (BASE, BASE));

    // And back: turned off again, its ids return to the host's first ones.
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{id}/stop"), json!({}))
            .status,
        200
    );
    std::fs::write(&config, format!("{text}\n")).unwrap();
    s.restart();
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{id}/resume"), json!({}))
            .status,
        200
    );
    let out = s.sh(&id, "cat ~/old.txt; id -u");
    assert_eq!(out["stdout"], "note\nmore\n1000\n", "{out}");
    assert_eq!(owner(&from_host(&id, "/home/user/old.txt")), (1000, 1000));
}

#[test]
fn template_layers_hold_ids_from_zero_and_sandboxes_see_their_owners() {
    let s = Server::start();
    let b = build(
        &s,
        KEY,
        &json!({
            "id": "owned",
            "steps": [ { "run": "mkdir /opt/owned && echo r > /opt/owned/root-file && \
                        install -o 1000 -g 1000 -m 640 /dev/null /opt/owned/user-file" } ],
            "default_size": "xs"
        }),
    );
    assert_eq!(b["state"], "ready", "{b}");
    let id = s.create(json!({ "template_id": "owned" }));
    let out = s.sh(
        &id,
        "stat -c '%n %U %a' /opt/owned /opt/owned/root-file /opt/owned/user-file && echo w >> /opt/owned/user-file && echo written",
    );
    assert_eq!(
        out["stdout"],
        "/opt/owned root 755\n/opt/owned/root-file root 644\n/opt/owned/user-file user 640\nwritten\n",
        "{out}"
    );
    // On disk the layer holds the ids the files have inside (a layer is not tied to a range).
    let mut found = Vec::new();
    let mut stack = vec![s.data_dir().join("layers")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if e.file_name() == "user-file" {
                found.push((m.uid(), m.gid()));
            } else if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    assert_eq!(found, [(1000, 1000)]);
}

#[test]
fn a_uid_range_that_does_not_fit_stops_the_server_with_a_clear_error() {
    let err = serve_refuses("[isolation]\nuid_base = 1000\n");
    assert!(
        err.contains("isolation.uid_base 1000 must be at least 65536"),
        "{err}"
    );
}

#[test]
fn a_sandbox_that_uses_up_its_inotify_instances_leaves_the_host_and_others_theirs() {
    let s = Server::start();
    let (greedy, other) = (
        s.create(json!({ "size": "xs" })),
        s.create(json!({ "size": "xs" })),
    );
    let hold = "import ctypes, time\nl = ctypes.CDLL(None)\nn = 0\nwhile l.inotify_init() >= 0: n += 1\nopen('/tmp/n', 'w').write(str(n))\ntime.sleep(600)";
    let p = s.post(
        &format!("/api/v1/sandboxes/{greedy}/processes"),
        json!({ "argv": ["python3", "-c", hold] }),
    );
    assert_eq!(p.status, 201, "{}", p.body);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let held = loop {
        let out = s.sh(&greedy, "cat /tmp/n 2>/dev/null");
        // The file exists a moment before its count is written.
        if out["exit_code"] == 0 && !out["stdout"].as_str().unwrap_or("").is_empty() {
            break out["stdout"].as_str().unwrap().parse::<u32>().unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the holder never finished"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(held >= 100, "{held}");
    // The host's root (this test runs as root) and the other sandbox still make instances.
    // SAFETY: inotify_init1 and close on a descriptor this test owns.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    assert!(fd >= 0, "host: {}", std::io::Error::last_os_error());
    unsafe { libc::close(fd) };
    let out = s.sh(
        &other,
        "python3 -c 'import ctypes; print(ctypes.CDLL(None).inotify_init() >= 0)'",
    );
    assert_eq!(out["stdout"], "True\n", "{out}");
}
