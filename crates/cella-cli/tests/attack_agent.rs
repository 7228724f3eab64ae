//! Attacks on the sandbox's agent through the files, exec, code and artifact routes, as a
//! tenant (even root inside its sandbox) would try them: each must fail with a clear 4xx and
//! leave nothing behind.

mod common;
use common::{Server, KEY};
use serde_json::{json, Value};

fn root_sh(s: &Server, id: &str, command: &str) -> Value {
    s.exec(id, json!({ "command": command, "user": "root" }))
}

fn download(s: &Server, id: &str, path: &str) -> common::R {
    s.get(&format!("/api/v1/sandboxes/{id}/files?path={path}"))
}

fn upload(s: &Server, id: &str, path: &str, body: Vec<u8>) -> common::R {
    s.raw(
        "PUT",
        &format!("/api/v1/sandboxes/{id}/files?path={path}&user=root"),
        Some(KEY),
        Some(body),
        &[],
    )
}

fn message(r: &common::R) -> String {
    r.body["error"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

#[test]
fn fifos_and_devices_are_refused_at_once_and_never_hang_the_agent() {
    let s = Server::start_with("[rate_limits]\nread = { per_second = 100000.0, burst = 100000 }\n");
    let id = s.create(json!({ "size": "xs" }));
    root_sh(&s, &id, "mkfifo /tmp/fifo && echo hello > /tmp/plain");
    // Before, each of these hung an agent thread forever, and 513 of them every file operation.
    for _ in 0..600 {
        let r = download(&s, &id, "/tmp/fifo");
        r.assert_error(409, "CONFLICT");
        assert!(message(&r).contains("not a regular file"), "{}", r.body);
    }
    // An upload onto the FIFO is refused too, and the FIFO stays what it was.
    let r = upload(&s, &id, "/tmp/fifo", b"data".to_vec());
    r.assert_error(409, "CONFLICT");
    assert!(message(&r).contains("not a regular file"), "{}", r.body);
    let kind = root_sh(
        &s,
        &id,
        "stat -c %F /tmp/fifo; ls -a /tmp | grep -c cella-upload",
    );
    assert_eq!(kind["stdout"], "fifo\n0\n");
    // Devices: /dev/tty has no terminal behind it (ENXIO), /dev/null and /dev/zero are not files.
    for dev in ["/dev/tty", "/dev/null", "/dev/zero", "/dev/urandom"] {
        let r = download(&s, &id, dev);
        r.assert_error(409, "CONFLICT");
    }
    // A directory is a conflict as well, not a server error.
    download(&s, &id, "/tmp").assert_error(409, "CONFLICT");
    // The agent still serves file operations.
    let r = download(&s, &id, "/tmp/plain");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, Value::String("hello\n".into()));
}

#[test]
fn a_full_disk_is_507_insufficient_storage_and_leaves_no_partial_file() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    // Root fills the sandbox's disk, reserved blocks included.
    root_sh(
        &s,
        &id,
        "fallocate -l $(df --output=avail -B1 /tmp | tail -1) /tmp/fill 2>/dev/null; \
         dd if=/dev/zero of=/tmp/fill2 bs=64k 2>/dev/null; \
         dd if=/dev/zero of=/tmp/fill3 bs=4k 2>/dev/null; sync; true",
    );
    let r = upload(&s, &id, "/tmp/new.bin", vec![7u8; 4 * 1024 * 1024]);
    r.assert_error(507, "INSUFFICIENT_STORAGE");
    assert!(message(&r).contains("disk is full"), "{}", r.body);
    let left = root_sh(&s, &id, "ls -a /tmp | grep -c -e cella-upload -e new.bin");
    assert_eq!(left["stdout"], "0\n");
}

/// A program inside the sandbox that swaps a directory and a symlink to /proc/1 (the agent)
/// with `RENAME_EXCHANGE`, as fast as it can, until /tmp/race/stop exists.
const RENAMER: &str = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs('/tmp/race/d', exist_ok=True)
for n in ('marker-a', 'marker-b'):
    open('/tmp/race/d/' + n, 'w').close()
if not os.path.islink('/tmp/race/l'):
    os.symlink('/proc/1', '/tmp/race/l')
a, b = b'/tmp/race/d', b'/tmp/race/l'
while not os.path.exists('/tmp/race/stop'):
    libc.renameat2(-100, a, -100, b, 2)  # AT_FDCWD, RENAME_EXCHANGE
"#;

#[test]
fn listings_and_stats_racing_a_rename_exchange_never_show_proc() {
    // Thousands of reads in a row: above the default rate limit.
    let s = Server::start_with("[rate_limits]\nread = { per_second = 100000.0, burst = 100000 }\n");
    let id = s.create(json!({ "size": "xs" }));
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/files/mkdir"),
        json!({ "path": "/tmp/race" }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let up = s.raw(
        "PUT",
        &format!("/api/v1/sandboxes/{id}/files?path=/tmp/race/renamer.py"),
        Some(KEY),
        Some(RENAMER.as_bytes().to_vec()),
        &[],
    );
    assert_eq!(up.status, 200, "{}", up.body);
    let spawned = s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "argv": ["python3", "/tmp/race/renamer.py"] }),
    );
    assert_eq!(spawned.status, 201, "{}", spawned.body);
    // Wait until the race is on.
    let mut started = false;
    for _ in 0..100 {
        if s.sh(&id, "test -L /tmp/race/l -o -L /tmp/race/d && echo y")["stdout"] == "y\n" {
            started = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(started, "the renamer did not start");
    let proc_names = [
        "status",
        "cmdline",
        "environ",
        "maps",
        "fd",
        "mountinfo",
        "cwd",
        "exe",
    ];
    let (mut listed, mut refused) = (0, 0);
    for i in 0..250 {
        for dir in ["/tmp/race/d", "/tmp/race/l"] {
            let recursive = if i % 2 == 0 { "&recursive=true" } else { "" };
            let r = s.get(&format!(
                "/api/v1/sandboxes/{id}/files/list?path={dir}{recursive}"
            ));
            match r.status {
                200 => {
                    listed += 1;
                    for e in r.data().as_array().unwrap() {
                        let name = e["name"].as_str().unwrap();
                        assert!(
                            name.starts_with("marker-"),
                            "listing {dir} showed {name}: {}",
                            r.body
                        );
                    }
                }
                400 | 404 | 409 => refused += 1,
                other => panic!("listing {dir}: {other} {}", r.body),
            }
            for name in proc_names {
                let r = s.get(&format!(
                    "/api/v1/sandboxes/{id}/files/stat?path={dir}/{name}"
                ));
                assert_ne!(r.status, 200, "stat of {dir}/{name} answered {}", r.body);
                assert!(r.status < 500, "{}", r.body);
                let r = download(&s, &id, &format!("{dir}/{name}"));
                assert!(
                    r.status == 400 || r.status == 404 || r.status == 409,
                    "download of {dir}/{name}: {} {}",
                    r.status,
                    r.body
                );
            }
        }
    }
    assert!(
        listed > 0 && refused > 0,
        "listed {listed}, refused {refused}"
    );
    root_sh(&s, &id, "touch /tmp/race/stop");
}

#[test]
fn an_exec_timeout_kills_children_that_made_a_session_of_their_own() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let r = s.exec(
        &id,
        json!({ "command": "(setsid sleep 301 &); sleep 30", "timeout_sec": 2 }),
    );
    assert_eq!(r["timed_out"], true, "{r}");
    let left = s.exec(&id, json!({ "argv": ["pgrep", "-f", "sleep 301"] }));
    assert_eq!(left["exit_code"], 1, "left running: {}", left["stdout"]);

    // The same through a streamed exec.
    let st = s.raw(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec/stream"),
        Some(KEY),
        Some(
            json!({ "command": "(setsid sleep 302 &); sleep 30", "timeout_sec": 2 })
                .to_string()
                .into_bytes(),
        ),
        &[],
    );
    assert_eq!(st.status, 200);
    let text = st.body.as_str().unwrap_or_default().to_string();
    assert!(text.contains("\"timed_out\":true"), "{text}");
    let left = s.exec(&id, json!({ "argv": ["pgrep", "-f", "sleep 302"] }));
    assert_eq!(left["exit_code"], 1, "left running: {}", left["stdout"]);

    // A command that keeps forking new sessions while the timeout strikes leaves nothing either:
    // the exec's cgroup is frozen (or killed at once) before its members are read.
    let r = s.exec(
        &id,
        json!({ "command": "while :; do (setsid sleep 303 &); done", "timeout_sec": 2 }),
    );
    assert_eq!(r["timed_out"], true, "{r}");
    let left = s.exec(&id, json!({ "argv": ["pgrep", "-f", "sleep 303"] }));
    assert_eq!(left["exit_code"], 1, "left running: {}", left["stdout"]);

    // Each exec runs in a cgroup of its own below the sandbox's (seen from inside as the
    // sandbox's cgroup namespace shows it), which is gone once the exec is over.
    let r = s.sh(&id, "cat /proc/self/cgroup");
    let own = r["stdout"].as_str().unwrap_or_default();
    assert!(
        own.lines()
            .any(|l| l.contains("::/exec-") || l.contains(":freezer:/exec-")),
        "{own}"
    );
    let exec_groups = || -> Vec<String> {
        common::cgroup_dirs(&id)
            .iter()
            .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("exec-"))
            .collect()
    };
    // Removed at the end of the exec (just after its answer) or, for the killed ones, at a later
    // exec; the one that stays is the next exec's, made ahead with its process waiting in it.
    s.sh(&id, "true");
    common::eventually("no exec cgroup left behind but the next one", || {
        exec_groups().len() <= 1
    });

    // What an exec that ends normally leaves behind keeps running, as documented.
    let r = s.sh(&id, "setsid sleep 300 >/dev/null 2>&1 < /dev/null &");
    assert_eq!(r["exit_code"], 0);
    let kept = s.exec(&id, json!({ "argv": ["pgrep", "-f", "sleep 300"] }));
    assert_eq!(kept["exit_code"], 0, "the background process is gone");
    // Its cgroup stays while it runs, and the sandbox's whole tree goes with the sandbox,
    // however many exec cgroups still hold processes.
    for n in 0..3 {
        let r = s.sh(
            &id,
            &format!("setsid sleep 40{n} >/dev/null 2>&1 < /dev/null &"),
        );
        assert_eq!(r["exit_code"], 0);
    }
    assert!(exec_groups().len() >= 4, "{:?}", exec_groups());
    assert_eq!(
        s.delete(&format!("/api/v1/sandboxes/{id}")).data()["state"],
        "destroyed"
    );
    common::wait_gone(&id);
}

#[test]
fn every_process_has_a_file_descriptor_limit() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let r = s.sh(&id, "ulimit -n; ulimit -Hn");
    assert_eq!(r["stdout"], "1024\n1024\n");
    // Root cannot raise it.
    let r = root_sh(
        &s,
        &id,
        "ulimit -n 100000 2>/dev/null && echo raised || echo refused",
    );
    assert_eq!(r["stdout"], "refused\n");
    // Opening files in a loop stops at the limit, far from the host's file-max.
    let opener = "import os\nfds = []\ntry:\n    while True:\n        fds.append(os.open('/etc/hostname', os.O_RDONLY))\nexcept OSError as e:\n    print(len(fds), e.errno)\n";
    let r = s.exec(&id, json!({ "argv": ["python3", "-c", opener] }));
    let out = r["stdout"].as_str().unwrap().trim().to_string();
    let (n, errno) = out.split_once(' ').unwrap();
    let n: u64 = n.parse().unwrap();
    assert!((1000..1024).contains(&n), "{out}");
    assert_eq!(errno, "24", "EMFILE");
    let nr = std::fs::read_to_string("/proc/sys/fs/file-nr").unwrap();
    let f: Vec<u64> = nr.split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert!(f[0] < f[2] / 2, "file-nr {nr}");
    // The sandbox's pids limit keeps pids x open files within its share of file-max.
    let file_max: u64 = std::fs::read_to_string("/proc/sys/fs/file-max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let dir = common::cgroup_dirs(&id)
        .into_iter()
        .find(|d| d.join("pids.max").exists())
        .expect("pids cgroup");
    let pids: u64 = std::fs::read_to_string(dir.join("pids.max"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        pids * 1024 <= (file_max / 10).max(128 * 1024),
        "pids.max {pids}"
    );
}

#[test]
fn a_symlink_planted_at_the_kernel_driver_is_replaced_not_followed() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    root_sh(
        &s,
        &id,
        "echo precious > /tmp/victim && mkdir -p /tmp/elsewhere /run && rm -rf /run/cella && \
         ln -s /tmp/elsewhere /run/cella && ln -s /tmp/victim /tmp/elsewhere/kernel.py && \
         ln -s /tmp/victim /tmp/elsewhere/kernel.js",
    );
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/code/run"),
        json!({ "code": "1 + 1" }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.data()["result"], "2");
    let after = root_sh(
        &s,
        &id,
        "cat /tmp/victim; ls -A /tmp/elsewhere | sort | tr '\\n' ' '; echo; stat -c %F /run/cella",
    );
    assert_eq!(
        after["stdout"], "precious\nkernel.js kernel.py \ndirectory\n",
        "{after}"
    );
    // Inside the real directory now, a symlink at the driver's own name.
    root_sh(&s, &id, "ln -sf /tmp/victim /run/cella/kernel.js");
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/code/run"),
        json!({ "code": "1 + 2", "language": "javascript" }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let after = root_sh(&s, &id, "cat /tmp/victim; stat -c %F /run/cella/kernel.js");
    assert_eq!(after["stdout"], "precious\nregular file\n", "{after}");
}

#[test]
fn artifacts_never_follow_symlinks_or_read_what_the_user_cannot() {
    let s = Server::start();
    let r = s.post(
        "/api/v1/sandboxes/run",
        json!({
            "size": "xs",
            "command": "mkdir -p out/sub && echo real > out/real.txt && \
                        ln -s /etc/shadow out/shadow.txt && ln -s /proc/1/environ out/env.txt && \
                        ln -s /proc/1 out/agent && ln -s /etc out/sub/etc && echo deep > out/sub/deep.txt",
            "artifacts": ["out/**", "/etc/shadow", "/root/**", "out/agent/*"]
        }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let mut paths: Vec<String> = r.data()["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["path"].as_str().unwrap().to_string())
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        ["/home/user/out/real.txt", "/home/user/out/sub/deep.txt"]
    );

    // The collect route, on a sandbox where root planted a link to its own secret.
    let id = s.create(json!({ "size": "xs" }));
    root_sh(
        &s,
        &id,
        "echo secret > /root/secret && chmod 600 /root/secret && mkdir -p /home/user/o && \
         ln -s /root/secret /home/user/o/s.txt && echo fine > /home/user/o/f.txt",
    );
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/artifacts"),
        json!({ "paths": ["o/*.txt", "/root/secret", "/etc/shadow"] }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let got: Vec<&str> = r
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["path"].as_str().unwrap())
        .collect();
    assert_eq!(got, ["/home/user/o/f.txt"]);
}

/// Watches, as root inside, every new child of the agent and tries to open its memory for
/// writing; prints what it reached that runs the agent's own program. Stops at `/tmp/stop`.
const MEMORY_WATCHER: &str = r#"
import os
seen, tried, reached = set(), 0, []
# gVisor's Yama lets its root turn the check off (the host's is the host's).
try:
    with open('/proc/sys/kernel/yama/ptrace_scope', 'w') as f:
        f.write('0')
except OSError:
    pass
open('/tmp/ready', 'w').close()
while not os.path.exists('/tmp/stop'):
    for p in os.listdir('/proc'):
        if not p.isdigit() or p in seen or p == '1':
            continue
        try:
            with open('/proc/%s/stat' % p) as f:
                ppid = f.read().rsplit(')', 1)[1].split()[1]
        except OSError:
            continue
        if ppid != '1':
            continue
        seen.add(p)
        tried += 1
        try:
            f = open('/proc/%s/mem' % p, 'r+b')
        except OSError:
            continue
        try:
            exe = os.readlink('/proc/%s/exe' % p)
        except OSError:
            exe = '?'
        f.close()
        if 'cella' in exe:
            reached.append(exe)
with open('/tmp/report.part', 'w') as f:
    f.write('tried %d reached %r\n' % (tried, reached))
os.rename('/tmp/report.part', '/tmp/report')
"#;

/// A command's start shares (or copies) the agent's memory until its `execve`, while it already
/// has the command's ids: a root inside racing it must not get the agent's memory.
fn no_command_start_gives_the_agents_memory(runtime: &str) {
    let s = Server::start_with("[rate_limits]\nexec = { per_second = 100000.0, burst = 100000 }\n");
    let id = s.create(json!({ "size": "xs", "runtime": runtime }));
    let w = s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "argv": ["python3", "-c", MEMORY_WATCHER], "user": "root" }),
    );
    assert_eq!(w.status, 201, "{}", w.body);
    common::eventually("the watcher is ready", || {
        root_sh(&s, &id, "test -e /tmp/ready")["exit_code"] == 0
    });
    // A long PATH holds each start in its search for a while, with the command's ids (root)
    // taken already: background processes, and execs (which start this way on gVisor). Without
    // the agent's memory made not dumpable, the watcher reached it on gVisor 6 times in these
    // 40 starts (with a PATH of 1,000 and 20 starts, none: the window is what it needs).
    let mut path: Vec<String> = (0..3000).map(|i| format!("/no/such/{i}")).collect();
    path.push("/usr/bin:/bin".into());
    let env = json!({ "PATH": path.join(":") });
    for _ in 0..20 {
        let p = s.post(
            &format!("/api/v1/sandboxes/{id}/processes"),
            json!({ "argv": ["true"], "user": "root", "env": env }),
        );
        assert_eq!(p.status, 201, "{}", p.body);
        let r = s.exec(&id, json!({ "argv": ["true"], "user": "root", "env": env }));
        assert_eq!(r["exit_code"], 0, "{r}");
    }
    root_sh(&s, &id, "touch /tmp/stop");
    common::eventually("the watcher's report", || {
        root_sh(&s, &id, "test -e /tmp/report")["exit_code"] == 0
    });
    let out = root_sh(&s, &id, "cat /tmp/report")["stdout"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(out.contains("reached []"), "{runtime}: {out}");
    assert!(
        !out.starts_with("tried 0 "),
        "{runtime}: it saw no start: {out}"
    );
}

#[test]
fn no_command_start_gives_the_agents_memory_on_namespaces() {
    no_command_start_gives_the_agents_memory("namespace");
}

#[test]
fn no_command_start_gives_the_agents_memory_on_gvisor() {
    if common::have_runsc() {
        no_command_start_gives_the_agents_memory("gvisor");
    }
}
