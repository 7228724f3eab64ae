//! Faults from outside the server: its data directory's file system full (a small loop-mounted
//! ext4 the test makes and removes) during uploads, template builds, snapshots and creates;
//! `nft` missing or failing (a stub first on the server's `PATH`, the servers told to use the
//! command rather than the library's helper); a sandbox's agent killed from
//! the host; and a sandbox that fork-bombs, fills its disk or allocates past its memory while a
//! neighbour keeps answering exec (its exec round trips before and during are printed, not
//! asserted). Each ends with a census of the server's host resources against the start.

mod common;
mod reliability;

use common::*;
use reliability::*;
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A small ext4 file system mounted over a server's data directory; unmounted and removed when
/// dropped (after the server, which is declared after it).
struct SmallDisk {
    image: PathBuf,
    mount: PathBuf,
}

impl SmallDisk {
    /// Stops `s`, moves its data directory onto a fresh `mib` MiB ext4 and starts it again.
    fn under(s: &mut Server, mib: u64) -> SmallDisk {
        let image = s.dir.path().with_extension("datafs.img");
        let staging = s.dir.path().with_extension("datafs.mnt");
        s.stop();
        std::fs::File::create(&image)
            .unwrap()
            .set_len(mib * 1024 * 1024)
            .unwrap();
        run("mkfs.ext4", &["-q", "-F", image.to_str().unwrap()]);
        std::fs::create_dir_all(&staging).unwrap();
        run(
            "mount",
            &[
                "-o",
                "loop",
                image.to_str().unwrap(),
                staging.to_str().unwrap(),
            ],
        );
        let data = s.data_dir();
        run(
            "cp",
            &[
                "-a",
                &format!("{}/.", data.display()),
                staging.to_str().unwrap(),
            ],
        );
        run("umount", &[staging.to_str().unwrap()]);
        let _ = std::fs::remove_dir(&staging);
        run(
            "mount",
            &[
                "-o",
                "loop",
                image.to_str().unwrap(),
                data.to_str().unwrap(),
            ],
        );
        s.restart();
        SmallDisk { image, mount: data }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

/// Fills the file system of `dir` with `dir/filler` until it has no room left.
fn fill(dir: &Path) -> u64 {
    let mut f = std::fs::File::create(dir.join("filler")).unwrap();
    let chunk = vec![0x5au8; 1024 * 1024];
    let mut n = 0u64;
    while f.write_all(&chunk).is_ok() {
        n += chunk.len() as u64;
    }
    let _ = f.sync_all();
    // The last partial writes.
    while f.write_all(&chunk[..4096]).is_ok() {
        n += 4096;
    }
    let _ = f.sync_all();
    n
}

/// A refusal a user can act on: a 4xx or 507, in the envelope with a message.
fn assert_clear_refusal(s: &Server, what: &str, r: &R) {
    if r.status >= 500 && r.status != 507 {
        let log = s.log();
        let errs: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
        panic!("{what}: {} {}; the server said: {errs:?}", r.status, r.body);
    }
    assert!(
        (400..500).contains(&r.status) || r.status == 507,
        "{what}: {} {}",
        r.status,
        r.body
    );
    let code = r.code().to_string();
    r.assert_error(r.status, &code);
}

#[test]
fn a_full_data_disk_gives_clear_errors_and_keeps_the_store_consistent() {
    let mut s = Server::start_with(UNLIMITED);
    let disk = SmallDisk::under(&mut s, 128);
    let _ = &disk;
    let data = s.data_dir();
    let a = s.create(json!({ "size": "xs" }));
    assert_eq!(s.sh(&a, "echo before > /home/user/note")["exit_code"], 0);
    let mut tracked = Tracked::default();
    tracked.record(&s, &a);
    let snap_ok = s.post(&format!("/api/v1/sandboxes/{a}/snapshots"), json!({}));
    assert_eq!(snap_ok.status, 201, "{}", snap_ok.body);
    let filled = fill(&data);
    println!(
        "faults: data disk of 128 MiB filled with {} MiB",
        filled >> 20
    );
    let mut seen = Vec::new();
    // A snapshot: refused, and none is listed.
    let snap = s.post(&format!("/api/v1/sandboxes/{a}/snapshots"), json!({}));
    seen.push(format!("snapshot: {} {}", snap.status, snap.body));
    assert_clear_refusal(&s, "snapshot on a full disk", &snap);
    // A template build: refused at once or failed with a log saying why.
    let spec =
        json!({ "id": "full", "steps": [ { "run": "head -c 50000000 /dev/zero > /opt/blob" } ] });
    let b = s.post("/api/v1/templates", spec.clone());
    if b.status == 202 {
        let id = b.data()["id"].as_str().unwrap().to_string();
        let end = wait_build(&s, KEY, "full", &id);
        seen.push(format!("template build: {} {}", end["state"], end["error"]));
        assert_eq!(end["state"], "failed", "{end}");
    } else {
        seen.push(format!("template build: {} {}", b.status, b.body));
        assert_clear_refusal(&s, "template build on a full disk", &b);
    }
    // A create: refused cleanly.
    let c = s.post("/api/v1/sandboxes", json!({ "size": "xs" }));
    seen.push(format!("create: {} {}", c.status, c.body));
    if c.status == 201 {
        let id = c.data()["id"].as_str().unwrap().to_string();
        tracked.record(&s, &id);
        assert_eq!(s.delete(&format!("/api/v1/sandboxes/{id}")).status, 200);
    } else {
        assert_clear_refusal(&s, "create on a full disk", &c);
    }
    // An upload into the running sandbox (its disk is a sparse image on the full disk).
    let up = s.raw(
        "PUT",
        &format!("/api/v1/sandboxes/{a}/files?path=/home/user/upload"),
        Some(KEY),
        Some(vec![7u8; 8 * 1024 * 1024]),
        &[],
    );
    seen.push(format!("upload: {} {}", up.status, up.body));
    if up.status != 200 {
        assert_clear_refusal(&s, "upload on a full disk", &up);
    }
    // The server still answers.
    assert_eq!(s.req("GET", "/healthz", None, None).status, 200);
    assert_eq!(s.get("/api/v1/sandboxes").status, 200);
    assert_eq!(s.get(&format!("/api/v1/sandboxes/{a}")).status, 200);
    for line in &seen {
        println!("faults: disk full: {line}");
    }
    // Room again: everything works, and the store holds only what succeeded.
    std::fs::remove_file(data.join("filler")).unwrap();
    let snaps = s.get("/api/v1/snapshots");
    assert_eq!(
        snaps.data().as_array().unwrap().len(),
        1,
        "only the snapshot that was made: {}",
        snaps.body
    );
    let snap2 = s.post(&format!("/api/v1/sandboxes/{a}/snapshots"), json!({}));
    assert_eq!(snap2.status, 201, "{}", snap2.body);
    let built = build(
        &s,
        KEY,
        &json!({ "id": "after", "steps": [ { "run": "echo ok > /opt/ok" } ] }),
    );
    assert_eq!(built["state"], "ready", "{built}");
    let b2 = s.create(json!({ "template_id": "after", "size": "xs" }));
    assert_eq!(s.sh(&b2, "cat /opt/ok")["stdout"], "ok\n");
    tracked.record(&s, &b2);
    let out = s.sh(
        &a,
        "cat /home/user/note; echo again > /home/user/note2 && cat /home/user/note2",
    );
    println!("faults: disk full: the sandbox afterwards: {out}");
    let from = s.post(
        "/api/v1/sandboxes",
        json!({ "snapshot_id": snap_ok.data()["id"], "size": "xs" }),
    );
    assert_eq!(from.status, 201, "{}", from.body);
    let c = from.data()["id"].as_str().unwrap().to_string();
    tracked.record(&s, &c);
    assert_eq!(s.sh(&c, "cat /home/user/note")["stdout"], "before\n");
    for id in [&a, &b2, &c] {
        assert_eq!(s.delete(&format!("/api/v1/sandboxes/{id}")).status, 200);
    }
    let now = assert_back_to_no_sandboxes(&s, &tracked);
    println!("faults: disk full: after: {}", now.summary());
}

/// After every sandbox is destroyed: no mount, loop device, cgroup, chain, process, sandbox file,
/// namespace or interface of the server is left (the baseline of a server with none).
fn assert_back_to_no_sandboxes(s: &Server, tracked: &Tracked) -> Census {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c = Census::take(s);
        let (ns, ifs) = tracked.left(s);
        let clean = c.mounts.iter().all(|m| !m.contains("/sandboxes/"))
            && c.loops.is_empty()
            && c.cgroups.is_empty()
            && c.chains.is_empty()
            && c.procs.is_empty()
            && c.sandbox_files.is_empty()
            && ns.is_empty()
            && ifs.is_empty();
        if clean {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "left: {c:?}, namespaces {ns:?}, interfaces {ifs:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A stub `nft` first on every server's `PATH`: it fails when the file `nft-fail` (exits 1) or
/// `nft-missing` (exits 127, as a shell does for a missing program) is next to the calling
/// server's data directory, and runs the real `nft` otherwise, so other servers of this binary
/// (and the test's own census) are not disturbed.
fn nft_stub() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let real = ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("/usr/sbin/nft");
        let dir = std::env::temp_dir().join(format!("cella-nft-stub-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = format!(
            "#!/bin/sh\n\
             d=$(tr '\\0' '\\n' < /proc/$PPID/cmdline 2>/dev/null | sed -n '/^--data-dir$/{{n;p;}}')\n\
             if [ -n \"$d\" ] && [ -e \"$d/../nft-missing\" ]; then echo 'nft: not found' >&2; exit 127; fi\n\
             if [ -n \"$d\" ] && [ -e \"$d/../nft-fail\" ]; then echo 'Error: Could not process rule: Operation not permitted' >&2; exit 1; fi\n\
             exec {real} \"$@\"\n"
        );
        let stub = dir.join("nft");
        std::fs::write(&stub, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = std::env::var("PATH").unwrap_or_default();
        std::env::set_var("PATH", format!("{}:{path}", dir.display()));
        // The servers run every batch with the command (the stub), not through the library's
        // helper: what they do with a failed batch is the same either way.
        std::env::set_var("CELLA_NFT", "command");
    });
}

fn flag(s: &Server, name: &str, on: bool) {
    let p = s.dir.path().join(name);
    if on {
        std::fs::write(p, "").unwrap();
    } else {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn nft_failing_fails_creates_cleanly() {
    nft_stub();
    let s = Server::start_with(UNLIMITED);
    let a = s.create(json!({ "size": "xs" }));
    let mut tracked = Tracked::default();
    tracked.record(&s, &a);
    assert_eq!(tracked.ifindexes.len(), 1, "the server has a firewall");
    let base_chains = Census::take(&s).chains;
    flag(&s, "nft-fail", true);
    let mut seen = Vec::new();
    for _ in 0..3 {
        let r = s.post("/api/v1/sandboxes", json!({ "size": "xs" }));
        seen.push(format!("{} {}", r.status, r.body));
        assert!(
            r.status != 201,
            "a sandbox without its firewall: {}",
            r.body
        );
        assert!(r.status != 500, "{}", r.body);
        let code = r.code().to_string();
        r.assert_error(r.status, &code);
    }
    println!("faults: nft failing: create answered {}", seen[0]);
    // The running sandbox still answers; nothing of the refused creates is left.
    assert_eq!(s.sh(&a, "echo fine")["stdout"], "fine\n");
    let live = s.get("/api/v1/sandboxes");
    assert_eq!(live.data().as_array().unwrap().len(), 1, "{}", live.body);
    let c = Census::take(&s);
    assert_eq!(c.chains, base_chains);
    assert_eq!(
        c.sandbox_files
            .iter()
            .filter(|f| !f.contains(a.as_str()))
            .count(),
        0,
        "{:?}",
        c.sandbox_files
    );
    // nft works again: creates work again, and destroy removes everything.
    flag(&s, "nft-fail", false);
    let b = s.create(json!({ "size": "xs" }));
    tracked.record(&s, &b);
    for id in [&a, &b] {
        assert_eq!(s.delete(&format!("/api/v1/sandboxes/{id}")).status, 200);
    }
    assert_back_to_no_sandboxes(&s, &tracked);
}

#[test]
fn nft_missing_at_start_gives_loopback_only_sandboxes() {
    nft_stub();
    let dir_flag = |s: &Server| s.dir.path().join("nft-missing");
    // The flag must exist before the server starts: start, flag, restart.
    let mut s = Server::start_with(UNLIMITED);
    std::fs::write(dir_flag(&s), "").unwrap();
    s.restart();
    assert!(s.log().contains("nft is not available"), "{}", s.log());
    // What needs the network is refused clearly; a plain create works, without an interface.
    let r = s.post(
        "/api/v1/sandboxes",
        json!({ "size": "xs", "model_access": true }),
    );
    println!(
        "faults: nft missing: model_access create: {} {}",
        r.status, r.body
    );
    r.assert_error(400, "INVALID_REQUEST");
    let id = s.create(json!({ "size": "xs" }));
    let out = s.sh(
        &id,
        "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '",
    );
    assert_eq!(out["stdout"], "lo\n", "{out}");
    assert!(Census::take(&s).chains.is_empty());
    assert_eq!(s.delete(&format!("/api/v1/sandboxes/{id}")).status, 200);
    assert_back_to_no_sandboxes(&s, &Tracked::default());
}

/// The host pid of a sandbox's PID 1 (its agent).
fn agent_pid(id: &str) -> i32 {
    sandbox_pids(id)
        .into_iter()
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/status"))
                .unwrap_or_default()
                .lines()
                .find(|l| l.starts_with("NSpid:"))
                .is_some_and(|l| l.split_whitespace().last() == Some("1"))
        })
        .expect("the agent's process")
}

#[test]
fn a_killed_agent_gives_clear_errors_and_destroy_cleans_up() {
    let s = Server::start_with(UNLIMITED);
    let a = s.create(json!({ "size": "xs" }));
    let neighbour = s.create(json!({ "size": "xs" }));
    let mut tracked = Tracked::default();
    tracked.record(&s, &a);
    tracked.record(&s, &neighbour);
    let pid = agent_pid(&a);
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let r = s.post(
        &format!("/api/v1/sandboxes/{a}/exec"),
        json!({ "command": "echo hi" }),
    );
    println!(
        "faults: agent killed: exec answered {} {}",
        r.status, r.body
    );
    assert!(
        r.status != 500 && r.status != 200,
        "{} {}",
        r.status,
        r.body
    );
    let code = r.code().to_string();
    r.assert_error(r.status, &code);
    // What the sandbox is reported as, once the server has seen it die.
    let deadline = Instant::now() + Duration::from_secs(30);
    let state = loop {
        let g = s.get(&format!("/api/v1/sandboxes/{a}"));
        assert_eq!(g.status, 200);
        let st = g.data()["state"].as_str().unwrap().to_string();
        if st != "running" || Instant::now() > deadline {
            break g.data().clone();
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    println!(
        "faults: agent killed: the sandbox is reported {} (ready {}, reason {})",
        state["state"], state["ready"], state["state_reason"]
    );
    assert_eq!(s.sh(&neighbour, "echo fine")["stdout"], "fine\n");
    for id in [&a, &neighbour] {
        let d = s.delete(&format!("/api/v1/sandboxes/{id}"));
        assert_eq!(d.status, 200, "{}", d.body);
    }
    assert_back_to_no_sandboxes(&s, &tracked);
}

/// Execs on `id` one after another until `stop`; returns their round trips (ms) and failures.
fn exec_loop(s: &Server, id: &str, stop: &AtomicBool) -> (Vec<f64>, Vec<String>) {
    let mut ms = Vec::new();
    let mut bad = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let t = Instant::now();
        let r = s.post(
            &format!("/api/v1/sandboxes/{id}/exec"),
            json!({ "command": "echo n" }),
        );
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
        if r.status != 200 || r.data()["stdout"] != "n\n" {
            bad.push(format!("{} {}", r.status, r.body));
        }
    }
    (ms, bad)
}

/// The cgroup file `name` of sandbox `id` (first hierarchy that has it).
fn cg(id: &str, name: &str) -> Option<String> {
    cgroup_dirs(id)
        .into_iter()
        .find_map(|d| std::fs::read_to_string(d.join(name)).ok())
        .map(|t| t.trim().to_string())
}

#[test]
fn a_noisy_sandbox_stays_in_its_limits_while_its_neighbour_answers() {
    let s = Server::start_with(UNLIMITED);
    let noisy = s.create(json!({ "size": "xs" }));
    let neighbour = s.create(json!({ "size": "xs" }));
    let mut tracked = Tracked::default();
    tracked.record(&s, &noisy);
    tracked.record(&s, &neighbour);
    let long = long();
    let phase = Duration::from_secs(if long { 20 } else { 4 });
    // Before: the neighbour alone.
    let stop = AtomicBool::new(false);
    let before = std::thread::scope(|sc| {
        let h = sc.spawn(|| exec_loop(&s, &neighbour, &stop));
        std::thread::sleep(phase);
        stop.store(true, Ordering::SeqCst);
        h.join().unwrap()
    });
    assert!(before.1.is_empty(), "{:?}", before.1);
    println!("faults: neighbour exec alone: {}", p50_p99(&before.0));
    let pids_max: u64 = cg(&noisy, "pids.max")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mem_max: u64 = cg(&noisy, "memory.max")
        .or_else(|| cg(&noisy, "memory.limit_in_bytes"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let disk_mb = s.get(&format!("/api/v1/sandboxes/{noisy}")).data()["disk_size_mb"]
        .as_u64()
        .unwrap();
    let attacks: [(&str, Value); 3] = [
        (
            "fork bomb",
            json!({ "command": "b() { b | b & }; b; sleep 60", "timeout_sec": phase.as_secs() }),
        ),
        (
            "disk fill",
            json!({ "command": "dd if=/dev/zero of=/home/user/fill bs=1M 2>&1 | tail -n 1; df -m /home/user | tail -n 1", "timeout_sec": 120 }),
        ),
        (
            "memory",
            // `tail` keeps a line that never ends in memory: 1.5 GiB of zeros.
            json!({ "command": "head -c 1536M /dev/zero | tail > /dev/null; echo exit $?", "timeout_sec": 120 }),
        ),
    ];
    let mut report = Vec::new();
    for (name, body) in attacks {
        let stop = AtomicBool::new(false);
        let peak_pids = Mutex::new(0u64);
        let (during, out) = std::thread::scope(|sc| {
            let h = sc.spawn(|| exec_loop(&s, &neighbour, &stop));
            let w = sc.spawn(|| {
                while !stop.load(Ordering::SeqCst) {
                    if let Some(n) = cg(&noisy, "pids.current").and_then(|v| v.parse().ok()) {
                        let mut p = peak_pids.lock().unwrap();
                        *p = (*p).max(n);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            });
            let out = s.exec(&noisy, body.clone());
            stop.store(true, Ordering::SeqCst);
            w.join().unwrap();
            (h.join().unwrap(), out)
        });
        assert!(
            during.1.is_empty(),
            "{name}: the neighbour failed: {:?}",
            during.1
        );
        let peak_mem: u64 = cg(&noisy, "memory.peak")
            .or_else(|| cg(&noisy, "memory.max_usage_in_bytes"))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let pids = *peak_pids.lock().unwrap();
        let line = format!(
            "{name}: neighbour exec {}; noisy peak pids {pids} (max {pids_max}), memory.peak {} MiB (max {} MiB); out {}",
            p50_p99(&during.0),
            peak_mem >> 20,
            mem_max >> 20,
            out["stdout"].as_str().unwrap_or("").trim().replace('\n', " | ")
        );
        println!("faults: {line}");
        report.push(line);
        assert!(
            pids_max > 0 && pids <= pids_max,
            "{name}: pids {pids} > {pids_max}"
        );
        if mem_max > 0 && peak_mem > 0 {
            assert!(peak_mem <= mem_max, "{name}: memory {peak_mem} > {mem_max}");
        }
        // The host file of its disk holds no more than its disk size.
        let img = s.data_dir().join("sandboxes").join(&noisy).join("disk.img");
        if let Ok(m) = std::fs::metadata(&img) {
            use std::os::unix::fs::MetadataExt;
            let used_mb = m.blocks() * 512 / (1024 * 1024);
            assert!(
                used_mb <= disk_mb,
                "{name}: disk image holds {used_mb} MiB > {disk_mb}"
            );
        }
        // The noisy sandbox itself still answers.
        let after = s.sh(&noisy, "rm -f /home/user/fill; echo alive");
        assert_eq!(after["stdout"], "alive\n", "{name}: {after}");
    }
    for id in [&noisy, &neighbour] {
        assert_eq!(s.delete(&format!("/api/v1/sandboxes/{id}")).status, 200);
    }
    assert_back_to_no_sandboxes(&s, &tracked);
}
