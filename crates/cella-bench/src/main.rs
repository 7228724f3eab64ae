//! `cella-bench`: one run that starts its own server on a temporary data dir, measures every
//! figure through the real HTTP API, runs the peers (`runc run`, `bwrap --unshare-all`, and a
//! spawn of `bash -c true` on the host: the floor of an exec) in the same run, and prints a table (`--json FILE` writes the figures). It builds nothing: it runs
//! the `cella` binary that sits beside it (build both with `cargo build --release`).
//! The model gateway's overhead is measured against a stand-in upstream of its own (`gateway`);
//! `--gateway-only` measures just that. Task runs (`tasks`: queued to running with a 10 MB
//! repository, heartbeat loss) use a second server with command agents; `--tasks-only`.
//! `--gvisor-only` measures only the gVisor runtime's rows, beside `runsc` alone (`runsc run` of `true`,
//! `runsc restore` of a checkpointed `sleep`).
//! `--phases` prints where a create, an exec and a destroy spend their time (`phases`).

mod gateway;
mod phases;
mod tasks;

use clap::Parser;
use reqwest::blocking::Client;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEY: &str = "cella_bench_admin_key_0123456789";

#[derive(Parser)]
#[command(about = "Benchmark Cella against runc and bubblewrap on this host")]
struct Args {
    /// A short run (under two minutes) with fewer samples.
    #[arg(long)]
    quick: bool,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The cella binary (default: beside this one).
    #[arg(long)]
    cella: Option<PathBuf>,
    /// Only the model gateway's figures.
    #[arg(long)]
    gateway_only: bool,
    /// Only the task runs' figures.
    #[arg(long)]
    tasks_only: bool,
    /// Only the gVisor runtime's figures (create, pause to disk, resume from disk, snapshots
    /// with memory, creates from them, forks).
    #[arg(long)]
    gvisor_only: bool,
    /// Only where the time of a create, an exec and a destroy goes, phase by phase.
    #[arg(long)]
    phases: bool,
}

struct Server {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
    http: Client,
}

impl Server {
    // The child is killed and waited for in `Drop`.
    #[allow(clippy::zombie_processes)]
    fn start(bin: &Path, extra_config: &str) -> Server {
        let dir = tempfile::Builder::new()
            .prefix("cella-bench-")
            .tempdir()
            .expect("temp dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = dir.path().join("config.toml");
        // No rate limits: the bench measures the server, not its throttle.
        // A warm pool for `small` only: cold creates are measured on `xs`.
        std::fs::write(&cfg, format!("{}{extra_config}", "[rate_limits]\nread = { per_second = 0.0, burst = 1 }\nlifecycle = { per_second = 0.0, burst = 1 }\nexec = { per_second = 0.0, burst = 1 }\n[pool]\ndefault = 0\nsizes = { small = 2 }\n")).unwrap();
        let child = Command::new(bin)
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--config",
            ])
            .arg(&cfg)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .env("CELLA_BOOTSTRAP_KEY", KEY)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting cella serve");
        let http = Client::builder()
            .timeout(Duration::from_secs(300))
            .pool_max_idle_per_host(64)
            .build()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        for _ in 0..1500 {
            if http
                .get(format!("{url}/healthz"))
                .send()
                .map(|r| r.status().is_success())
                .unwrap_or(false)
            {
                return Server {
                    child,
                    url,
                    _dir: dir,
                    http,
                };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the server did not start");
    }

    fn call(&self, key: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut rb = self
            .http
            .request(method.parse().unwrap(), format!("{}{}", self.url, path))
            .bearer_auth(key);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        match rb.send() {
            Ok(r) => {
                let st = r.status().as_u16();
                (st, r.json().unwrap_or(Value::Null))
            }
            Err(e) => (0, json!({ "error": e.to_string() })),
        }
    }

    fn create(&self, key: &str) -> Result<String, String> {
        self.create_size(key, "xs")
    }

    fn create_size(&self, key: &str, size: &str) -> Result<String, String> {
        let (st, v) = self.call(
            key,
            "POST",
            "/api/v1/sandboxes",
            Some(json!({ "size": size, "idle_timeout_sec": 0 })),
        );
        if st == 201 {
            Ok(v["data"]["id"].as_str().unwrap_or_default().to_string())
        } else {
            Err(format!("HTTP {st}: {v}"))
        }
    }

    /// A sandbox on the gVisor runtime (the server must have `runsc`).
    fn create_gvisor(&self, key: &str) -> Result<String, String> {
        let (st, v) = self.call(
            key,
            "POST",
            "/api/v1/sandboxes",
            Some(json!({ "size": "xs", "idle_timeout_sec": 0, "runtime": "gvisor" })),
        );
        if st == 201 {
            Ok(v["data"]["id"].as_str().unwrap_or_default().to_string())
        } else {
            Err(format!("HTTP {st}: {v}"))
        }
    }

    fn exec_true(&self, id: &str) {
        let (st, v) = self.call(
            KEY,
            "POST",
            &format!("/api/v1/sandboxes/{id}/exec"),
            Some(json!({ "argv": ["true"] })),
        );
        assert!(
            st == 200 && v["data"]["exit_code"] == 0,
            "exec failed: {st} {v}"
        );
    }

    fn destroy(&self, key: &str, id: &str) {
        self.call(key, "DELETE", &format!("/api/v1/sandboxes/{id}"), None);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Sandboxes outlive their server by design: the bench destroys its own before this, and
        // a server stopped with SIGTERM removes its warm pool.
        // SAFETY: a plain kill(2) of our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The server's own (now empty) cgroup parent, `cella/<instance>`, in every hierarchy.
        if let Ok(instance) = std::fs::read_to_string(self._dir.path().join("data/instance-id")) {
            let roots = std::fs::read_dir("/sys/fs/cgroup")
                .map(|rd| rd.flatten().map(|e| e.path()).collect())
                .unwrap_or_else(|_| Vec::new());
            for root in roots.into_iter().chain([PathBuf::from("/sys/fs/cgroup")]) {
                let _ = std::fs::remove_dir(root.join("cella").join(instance.trim()));
            }
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct Series {
    name: &'static str,
    samples: Vec<f64>,
    target: &'static str,
}

impl Series {
    fn sorted(&self) -> Vec<f64> {
        let mut v = self.samples.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        v
    }
    fn p(&self, q: f64) -> f64 {
        pct(&self.sorted(), q)
    }

    /// Whether the figures meet the target (`p50 <= 5, p99 <= 15`); None when it has none.
    fn met(&self) -> Option<bool> {
        let mut any = None;
        for part in self.target.split(',') {
            let Some((q, max)) = part.trim().split_once(" <= ") else {
                continue;
            };
            let (Some(q), Ok(max)) = (q.strip_prefix('p'), max.trim().parse::<f64>()) else {
                continue;
            };
            let Ok(q) = q.parse::<f64>() else {
                continue;
            };
            any = Some(any.unwrap_or(true) && self.p(q / 100.0) <= max);
        }
        any
    }
}

/// "met" or "NOT met" for a summary line.
fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

fn timed(n: usize, mut f: impl FnMut()) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            ms(t.elapsed())
        })
        .collect()
}

/// `GET /api/v1/sandboxes/{id}` answered per second, 32 requests always in flight on 32 kept
/// connections. The load comes from one thread (an async client on a single-threaded
/// runtime): a thread per connection spent more of the two cores switching between the
/// client's own threads than the server spent answering.
fn get_rps(url: &str, id: &str, secs: u64) -> f64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the load");
    let count = Arc::new(AtomicU64::new(0));
    rt.block_on(async {
        let c = reqwest::Client::new();
        let target = format!("{url}/api/v1/sandboxes/{id}");
        let until = tokio::time::Instant::now() + Duration::from_secs(secs);
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let (c, target, count) = (c.clone(), target.clone(), count.clone());
                tokio::spawn(async move {
                    while tokio::time::Instant::now() < until {
                        let ok = match c.get(&target).bearer_auth(KEY).send().await {
                            Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
                            Err(_) => false,
                        };
                        if ok {
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
    });
    count.load(Ordering::Relaxed) as f64 / secs as f64
}

/// The same load from `wrk` (one thread, 32 connections), a load generator in C that spends
/// far less of the two cores than the bench's own client, so more of them answer requests
/// (on one host: 39-48k/s by `wrk` where the bench's client gave 28k). None without `wrk`, or
/// when any answer was not a success.
fn get_rps_wrk(url: &str, id: &str, secs: u64) -> Option<f64> {
    if !ensure_program("wrk", "wrk") {
        return None;
    }
    let out = Command::new("wrk")
        .args(["-t1", "-c32", &format!("-d{secs}s")])
        .args(["-H", &format!("authorization: Bearer {KEY}")])
        .arg(format!("{url}/api/v1/sandboxes/{id}"))
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || text.contains("Non-2xx") || text.contains("Socket errors") {
        eprintln!("wrk: {text}");
        return None;
    }
    text.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Installs a Debian package when its program is missing (the bench's setup).
fn ensure_program(program: &str, package: &str) -> bool {
    let have = |p: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {p}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if have(program) {
        return true;
    }
    eprintln!("installing {package} for the peer measurement...");
    let _ = Command::new("apt-get")
        .args(["install", "-y", "-qq", package])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status();
    have(program)
}

fn bwrap_peer(n: usize) -> Option<Vec<f64>> {
    if !ensure_program("bwrap", "bubblewrap") {
        return None;
    }
    let mut args: Vec<String> = [
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for d in ["bin", "sbin", "lib", "lib64"] {
        if let Ok(t) = std::fs::read_link(format!("/{d}")) {
            args.extend(["--symlink".into(), t.display().to_string(), format!("/{d}")]);
        }
    }
    args.push("true".into());
    let ok = Command::new("bwrap")
        .args(&args)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    ok.then(|| {
        timed(n, || {
            Command::new("bwrap").args(&args).status().unwrap();
        })
    })
}

/// An OCI bundle whose process runs `args` on a root of the host's `/usr` (read-only), with a
/// `small` sandbox's limits: what the `runc` and `runsc` peers run.
fn peer_bundle(args: &[&str]) -> Option<tempfile::TempDir> {
    let bundle = tempfile::Builder::new()
        .prefix("cella-bench-oci-")
        .tempdir()
        .ok()?;
    let rootfs = bundle.path().join("rootfs");
    for d in ["usr", "proc", "dev", "sys", "tmp", "etc"] {
        std::fs::create_dir_all(rootfs.join(d)).ok()?;
    }
    for d in ["bin", "sbin", "lib", "lib64"] {
        if let Ok(t) = std::fs::read_link(format!("/{d}")) {
            let _ = std::os::unix::fs::symlink(t, rootfs.join(d));
        }
    }
    Command::new("runc")
        .arg("spec")
        .current_dir(bundle.path())
        .status()
        .ok()?;
    let spec_path = bundle.path().join("config.json");
    let mut spec: Value = serde_json::from_str(&std::fs::read_to_string(&spec_path).ok()?).ok()?;
    spec["process"]["terminal"] = json!(false);
    spec["process"]["args"] = json!(args);
    spec["root"]["readonly"] = json!(true);
    spec["mounts"].as_array_mut()?.push(json!({
        "destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro"]
    }));
    // The same limits as a `small` sandbox.
    spec["linux"]["resources"] = json!({
        "memory": { "limit": 4096u64 * 1024 * 1024 },
        "cpu": { "quota": 200000, "period": 100000 },
        "pids": { "limit": 2048 }
    });
    std::fs::write(&spec_path, serde_json::to_vec_pretty(&spec).ok()?).ok()?;
    Some(bundle)
}

fn runc_peer(n: usize) -> Option<Vec<f64>> {
    if !ensure_program("runc", "runc") {
        return None;
    }
    let bundle = peer_bundle(&["true"])?;
    let run = |i: usize| {
        Command::new("runc")
            .args(["run", "--bundle"])
            .arg(bundle.path())
            .arg(format!("cella-bench-{}-{i}", std::process::id()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if !run(usize::MAX) {
        return None;
    }
    let mut i = 0;
    Some(timed(n, || {
        i += 1;
        run(i);
    }))
}

/// How long the bench waits before each create of the cold and warm figures: the last
/// sample's destroy (answered before its teardown ends) and the pools' refills are over by then.
const SETTLE: Duration = Duration::from_millis(250);

/// What an exec cannot go below: spawning `true` on the host (found on `PATH`) and waiting
/// for it, with nothing of Cella around it. The bench's exec sends `argv: ["true"]`, which
/// the agent runs directly, with no shell.
fn spawn_peer(n: usize) -> Vec<f64> {
    timed(n, || {
        Command::new("true").status().expect("spawning true");
    })
}

/// The smallest program there is: an x86-64 ELF executable of one segment whose three
/// instructions call `exit(0)`, with no C library, so no dynamic linking and no library start.
/// Spawning it shows what a process start costs on this host, and what spawning `true` adds
/// (the dynamic loader and glibc's start, which asks the CPU about itself with `cpuid`).
const BARE_EXIT: [u8; 129] = {
    let mut b = [0u8; 129];
    // ELF header: 64-bit, little-endian, version 1, an executable for x86-64.
    let head: [u8; 20] = [
        0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0x3e, 0,
    ];
    let mut i = 0;
    while i < head.len() {
        b[i] = head[i];
        i += 1;
    }
    b[20] = 1; // e_version
    b[24] = 0x78; // e_entry = 0x400078: the code, right after the headers
    b[26] = 0x40;
    b[32] = 64; // e_phoff: the program header follows the ELF header
    b[52] = 64; // e_ehsize
    b[54] = 56; // e_phentsize
    b[56] = 1; // e_phnum

    // The one program header: load the whole file at 0x400000, readable and executable.
    b[64] = 1; // p_type = PT_LOAD
    b[68] = 5; // p_flags = R | X
    b[82] = 0x40; // p_vaddr = 0x400000
    b[90] = 0x40; // p_paddr
    b[96] = 129; // p_filesz
    b[104] = 129; // p_memsz
    b[113] = 0x10; // p_align = 0x1000

    // mov eax, 60 (exit); xor edi, edi; syscall
    let code: [u8; 9] = [0xb8, 60, 0, 0, 0, 0x31, 0xff, 0x0f, 0x05];
    let mut j = 0;
    while j < code.len() {
        b[120 + j] = code[j];
        j += 1;
    }
    b
};

/// Spawning [`BARE_EXIT`] and waiting for it (x86-64 only; None elsewhere).
fn spawn_bare_peer(n: usize) -> Option<Vec<f64>> {
    use std::os::unix::fs::PermissionsExt;
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    let dir = tempfile::Builder::new()
        .prefix("cella-bench-bare-")
        .tempdir()
        .ok()?;
    let exe = dir.path().join("exit0");
    std::fs::write(&exe, BARE_EXIT).ok()?;
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).ok()?;
    if !Command::new(&exe).status().is_ok_and(|s| s.success()) {
        return None;
    }
    Some(timed(n, || {
        Command::new(&exe)
            .status()
            .expect("spawning the bare program");
    }))
}

/// Microseconds one `cpuid` instruction takes here (x86-64 only): a few dozen nanoseconds on
/// bare metal; in a virtual machine each one exits to the hypervisor.
fn cpuid_us() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        const N: u32 = 2000;
        let t = Instant::now();
        for i in 0..N {
            // SAFETY: `cpuid` exists on every x86-64 CPU; leaf 4 (the caches) only reads. (A
            // safe function only in newer Rust than the workspace's minimum.)
            #[allow(unused_unsafe)]
            let r = unsafe { std::arch::x86_64::__cpuid_count(4, i & 3) };
            std::hint::black_box(r);
        }
        Some(t.elapsed().as_secs_f64() * 1e6 / f64::from(N))
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// `runsc` alone, with the flags the gVisor runtime uses (`ptrace`, no network): `runsc run`
/// of `true` to its end, and `runsc restore` of a checkpointed `sleep` until it runs again
/// (what every resume, create from a snapshot with memory and fork pays at least).
fn runsc_peers(n: usize) -> Option<(Vec<f64>, Vec<f64>)> {
    if !ensure_program("runc", "runc") || !Path::new("/usr/bin/runsc").exists() {
        return None;
    }
    let root = tempfile::Builder::new()
        .prefix("cella-bench-runsc-")
        .tempdir()
        .ok()?;
    let runsc = |args: &[&str]| {
        Command::new("runsc")
            .arg(format!("--root={}", root.path().display()))
            .args(["--platform=ptrace", "--network=none", "--ignore-cgroups"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    let bundle = peer_bundle(&["true"])?;
    let b = bundle.path().display().to_string();
    let id = |i: usize| format!("cella-bench-{}-{i}", std::process::id());
    if !runsc(&["run", "--bundle", &b, &id(usize::MAX)]) {
        return None;
    }
    let mut i = 0;
    let run = timed(n, || {
        i += 1;
        runsc(&["run", "--bundle", &b, &id(i)]);
    });
    // A sleeping container, checkpointed once; each sample restores it and waits until runsc
    // says it runs, then removes it.
    let sleeper = peer_bundle(&["sleep", "3600"])?;
    let sb = sleeper.path().display().to_string();
    let image = sleeper.path().join("image");
    let first = id(usize::MAX - 1);
    if !runsc(&["run", "--detach", "--bundle", &sb, &first])
        || !runsc(&[
            "checkpoint",
            &format!("--image-path={}", image.display()),
            &first,
        ])
    {
        runsc(&["delete", "--force", &first]);
        return Some((run, Vec::new()));
    }
    runsc(&["delete", "--force", &first]);
    let img = format!("--image-path={}", image.display());
    let mut restore = Vec::new();
    for j in 0..n {
        let c = id(usize::MAX - 2 - j);
        let t = Instant::now();
        let ok = runsc(&["restore", "--detach", &img, "--bundle", &sb, &c]);
        if ok {
            restore.push(ms(t.elapsed()));
        }
        runsc(&["delete", "--force", &c]);
    }
    Some((run, restore))
}

/// Create and first exec on the gVisor runtime (cold, and claimed from a warm pool), and with
/// ~100 MiB resident: its pause to disk and resume from disk, snapshots with memory, creates
/// restored from one, and forks with memory; no rows where the server has no `runsc`.
fn gvisor_series(s: &Server, bin: &Path, n: usize) -> Vec<Series> {
    let mut series = Vec::new();
    let gvisor = {
        let (_, t) = s.call(KEY, "GET", "/api/v1/templates/base", None);
        t["data"]["runtimes"]
            .as_array()
            .is_some_and(|r| r.iter().any(|x| x == "gvisor"))
    };
    if gvisor {
        let mut samples = Vec::new();
        for _ in 0..n {
            let t = Instant::now();
            let id = s.create_gvisor(KEY).expect("create on gvisor");
            s.exec_true(&id);
            samples.push(ms(t.elapsed()));
            s.destroy(KEY, &id);
        }
        series.push(Series {
            name: "gvisor_create_exec_ms",
            samples,
            target: "p50 <= 250",
        });
        // The first exec of a sandbox half a second after its create (a client that did
        // something else first): the agent has readied it by then.
        let mut later = Vec::new();
        for _ in 0..n.min(10) {
            let id = s.create_gvisor(KEY).expect("create on gvisor");
            std::thread::sleep(Duration::from_millis(500));
            let t = Instant::now();
            s.exec_true(&id);
            later.push(ms(t.elapsed()));
            s.destroy(KEY, &id);
        }
        series.push(Series {
            name: "gvisor_first_exec_later_ms",
            samples: later,
            target: "(0.5 s after the create)",
        });
        // `exec true` round trips in one gVisor sandbox (after its first exec).
        let id = s.create_gvisor(KEY).expect("create on gvisor");
        s.exec_true(&id);
        let mut execs = Vec::new();
        for _ in 0..n {
            let t = Instant::now();
            s.exec_true(&id);
            execs.push(ms(t.elapsed()));
        }
        s.destroy(KEY, &id);
        series.push(Series {
            name: "gvisor_exec_ms",
            samples: execs,
            target: "(none)",
        });
        series.push(gvisor_warm_series(bin, n));
        if let Some((run, restore)) = runsc_peers(n) {
            series.push(Series {
                name: "peer_runsc_run_ms",
                samples: run,
                target: "(runsc alone: run of `true`)",
            });
            if !restore.is_empty() {
                series.push(Series {
                    name: "peer_runsc_restore_ms",
                    samples: restore,
                    target: "(runsc alone: restore of a checkpointed sleep)",
                });
            }
        }
        // Pause to disk and resume from it, with ~100 MiB resident (a process holding 100 MiB
        // of bytes that are not zero, so every page is written and read back).
        let id = s.create_gvisor(KEY).expect("create on gvisor");
        let hold = "b = bytes(range(256)) * (100 * 4096)\nopen('/tmp/held', 'w').close()\nimport time\ntime.sleep(86400)\n";
        let (st, v) = s.call(
            KEY,
            "POST",
            &format!("/api/v1/sandboxes/{id}/processes"),
            Some(json!({ "argv": ["python3", "-c", hold] })),
        );
        assert_eq!(st, 201, "starting the memory holder: {v}");
        // Held once it made its file.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, out) = s.call(
                KEY,
                "POST",
                &format!("/api/v1/sandboxes/{id}/exec"),
                Some(json!({ "argv": ["test", "-e", "/tmp/held"] })),
            );
            if out["data"]["exit_code"] == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "the memory holder never held");
            std::thread::sleep(Duration::from_millis(100));
        }
        let (mut pauses, mut resumes) = (Vec::new(), Vec::new());
        for _ in 0..n.min(5) {
            let t = Instant::now();
            let (st, v) = s.call(KEY, "POST", &format!("/api/v1/sandboxes/{id}/pause"), None);
            assert_eq!(st, 200, "pause to disk: {v}");
            pauses.push(ms(t.elapsed()));
            let t = Instant::now();
            let (st, v) = s.call(KEY, "POST", &format!("/api/v1/sandboxes/{id}/resume"), None);
            assert_eq!(st, 200, "resume from disk: {v}");
            resumes.push(ms(t.elapsed()));
        }
        // Snapshots with memory of the same sandbox (~100 MiB resident), sandboxes restored
        // from one, and forks (one child each).
        let mut snaps = Vec::new();
        let mut snap_ms = Vec::new();
        for _ in 0..n.min(5) {
            let t = Instant::now();
            let (st, v) = s.call(
                KEY,
                "POST",
                &format!("/api/v1/sandboxes/{id}/snapshots"),
                Some(json!({ "memory": true })),
            );
            assert_eq!(st, 201, "snapshot with memory: {v}");
            snap_ms.push(ms(t.elapsed()));
            snaps.push(v["data"]["id"].as_str().unwrap_or_default().to_string());
        }
        let mut restores = Vec::new();
        for _ in 0..n.min(5) {
            let t = Instant::now();
            let (st, v) = s.call(
                KEY,
                "POST",
                "/api/v1/sandboxes",
                Some(json!({ "snapshot_id": snaps[0], "idle_timeout_sec": 0 })),
            );
            assert_eq!(st, 201, "create from a snapshot with memory: {v}");
            restores.push(ms(t.elapsed()));
            s.destroy(KEY, v["data"]["id"].as_str().unwrap_or_default());
        }
        for snap in &snaps {
            s.call(KEY, "DELETE", &format!("/api/v1/snapshots/{snap}"), None);
        }
        let mut forks = Vec::new();
        for _ in 0..n.min(3) {
            let t = Instant::now();
            let (st, v) = s.call(
                KEY,
                "POST",
                &format!("/api/v1/sandboxes/{id}/fork"),
                Some(json!({ "count": 1 })),
            );
            assert_eq!(st, 201, "fork with memory: {v}");
            forks.push(ms(t.elapsed()));
            for c in v["data"].as_array().into_iter().flatten() {
                s.destroy(KEY, c["id"].as_str().unwrap_or_default());
            }
        }
        s.destroy(KEY, &id);
        series.push(Series {
            name: "gvisor_snapshot_memory_ms",
            samples: snap_ms,
            target: "(none yet)",
        });
        series.push(Series {
            name: "gvisor_create_from_snapshot_ms",
            samples: restores,
            target: "p50 <= 150",
        });
        series.push(Series {
            name: "gvisor_fork_memory_ms",
            samples: forks,
            target: "p50 <= 500",
        });
        series.push(Series {
            name: "gvisor_pause_disk_ms",
            samples: pauses,
            target: "p50 <= 1000",
        });
        series.push(Series {
            name: "gvisor_resume_disk_ms",
            samples: resumes,
            target: "p50 <= 500",
        });
        series.extend(boot_image_series(s, n));
    }

    series
}

/// Whether `base`'s `small` size reads `fast_ready` now (a warm pool sandbox waits).
fn small_fast_ready(s: &Server) -> bool {
    let (_, t) = s.call(KEY, "GET", "/api/v1/templates/base", None);
    t["data"]["sizes"]
        .as_array()
        .and_then(|a| a.iter().find(|z| z["size"] == "small"))
        .map(|z| z["state"] == "fast_ready")
        .unwrap_or(false)
}

/// Create + first exec of a gVisor sandbox claimed from the warm pool: on a server of its own
/// whose default runtime is gVisor, so its `small` pool is of gVisor sandboxes and `base`'s
/// readiness says when one is ready (`fast_ready`); each sample waits for that, then times.
fn gvisor_warm_series(bin: &Path, n: usize) -> Series {
    let s = Server::start(bin, "[runtime]\ndefault = \"gvisor\"\n");
    let fast_ready = || small_fast_ready(&s);
    let mut samples = Vec::new();
    for _ in 0..n {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !fast_ready() {
            assert!(
                Instant::now() < deadline,
                "no gVisor pool sandbox became ready"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let t = Instant::now();
        let (st, v) = s.call(
            KEY,
            "POST",
            "/api/v1/sandboxes",
            Some(json!({ "size": "small", "idle_timeout_sec": 0, "runtime": "gvisor" })),
        );
        assert_eq!(st, 201, "create on gvisor from the pool: {v}");
        let id = v["data"]["id"].as_str().unwrap_or_default().to_string();
        s.exec_true(&id);
        samples.push(ms(t.elapsed()));
        s.destroy(KEY, &id);
    }
    Series {
        name: "gvisor_warm_create_exec_ms",
        samples,
        target: "(none)",
    }
}

/// A `snapshot_boot` template whose app holds 8 MiB and is ready one second after it starts
/// (the work an app does before it serves): a create + first exec restored from its boot image,
/// against a cold create + first exec of the same template (an `env` of its own makes a create
/// boot cold and start the app), and the first create, which boots cold and saves the image.
/// The spec of the bench's `snapshot_boot` template `id`: an app that holds 8 MiB and is ready
/// one second after it starts.
fn boot_template_spec(id: &str) -> Value {
    json!({
        "id": id,
        "snapshot_boot": true,
        "default_size": "xs",
        "start": "python3 -c 'import time; b = bytes(range(256)) * 4096 * 8; time.sleep(1); open(\"/tmp/app-ready\", \"w\").close(); time.sleep(86400)'",
        "ready": { "command": "test -e /tmp/app-ready" },
    })
}

/// Builds template `spec` and waits until its build is ready.
fn build_template(s: &Server, spec: Value) {
    let id = spec["id"].as_str().unwrap_or_default().to_string();
    let (st, v) = s.call(KEY, "POST", "/api/v1/templates", Some(spec));
    assert_eq!(st, 202, "building template {id}: {v}");
    let build = v["data"]["id"].as_str().unwrap_or_default().to_string();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (_, b) = s.call(
            KEY,
            "GET",
            &format!("/api/v1/templates/{id}/builds/{build}"),
            None,
        );
        match b["data"]["state"].as_str() {
            Some("ready") => break,
            Some("failed") => panic!("template {id}'s build failed: {b}"),
            _ => {}
        }
        assert!(Instant::now() < deadline, "the build did not end: {b}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Create + first exec of the `snapshot_boot` template with one warm sandbox, which the pool
/// restores from its boot image ahead of the create. Such a size reads `fast_ready` as soon as
/// its image exists (a create restores it), so each sample waits long enough for the refill's
/// restore instead (3 s; the claim shows as `store.claim` in `Server-Timing`).
fn boot_image_warm_series(s: &Server, n: usize) -> Series {
    let mut spec = boot_template_spec("bench-boot-warm");
    spec["warm"] = json!(1);
    build_template(s, spec);
    // The first create makes the image (the pool's first sandbox boots cold).
    let (st, v) = s.call(
        KEY,
        "POST",
        "/api/v1/sandboxes",
        Some(json!({ "template_id": "bench-boot-warm", "idle_timeout_sec": 0 })),
    );
    assert_eq!(
        st, 201,
        "the warm snapshot_boot template's first create: {v}"
    );
    s.destroy(KEY, v["data"]["id"].as_str().unwrap_or_default());
    let mut samples = Vec::new();
    for _ in 0..n.min(5) {
        std::thread::sleep(Duration::from_secs(3));
        let t = Instant::now();
        let (st, v) = s.call(
            KEY,
            "POST",
            "/api/v1/sandboxes",
            Some(json!({ "template_id": "bench-boot-warm", "idle_timeout_sec": 0 })),
        );
        assert_eq!(st, 201, "create of the warm snapshot_boot template: {v}");
        let id = v["data"]["id"].as_str().unwrap_or_default().to_string();
        s.exec_true(&id);
        samples.push(ms(t.elapsed()));
        s.destroy(KEY, &id);
    }
    s.call(KEY, "DELETE", "/api/v1/templates/bench-boot-warm", None);
    Series {
        name: "gvisor_boot_image_warm_create_exec_ms",
        samples,
        target: "(the same, claimed from its warm pool)",
    }
}

fn boot_image_series(s: &Server, n: usize) -> Vec<Series> {
    build_template(s, boot_template_spec("bench-boot"));
    let create_exec = |env: bool| {
        let mut body = json!({ "template_id": "bench-boot", "idle_timeout_sec": 0 });
        if env {
            body["env"] = json!({ "COLD": "1" });
        }
        let t = Instant::now();
        let (st, v) = s.call(KEY, "POST", "/api/v1/sandboxes", Some(body));
        assert_eq!(st, 201, "create of the snapshot_boot template: {v}");
        let id = v["data"]["id"].as_str().unwrap_or_default().to_string();
        s.exec_true(&id);
        (ms(t.elapsed()), id)
    };
    let (first, id) = create_exec(false);
    s.destroy(KEY, &id);
    let (mut restored, mut cold) = (Vec::new(), Vec::new());
    for _ in 0..n.min(10) {
        let (t, id) = create_exec(false);
        restored.push(t);
        s.destroy(KEY, &id);
        let (t, id) = create_exec(true);
        cold.push(t);
        s.destroy(KEY, &id);
    }
    s.call(KEY, "DELETE", "/api/v1/templates/bench-boot", None);
    vec![
        Series {
            name: "gvisor_boot_image_first_create_ms",
            samples: vec![first],
            target: "(none)",
        },
        Series {
            name: "gvisor_boot_image_create_exec_ms",
            samples: restored,
            target: "p50 <= 150",
        },
        Series {
            name: "gvisor_boot_template_cold_create_exec_ms",
            samples: cold,
            target: "(none)",
        },
        boot_image_warm_series(s, n),
    ]
}

/// Whether a cgroup hierarchy of this host shows the mount option `favordynmods`.
fn favordynmods_on() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|t| {
        t.lines().any(|l| {
            l.split_once(" - ").is_some_and(|(_, fs)| {
                fs.starts_with("cgroup") && fs.split([' ', ',']).any(|o| o == "favordynmods")
            })
        })
    })
}

fn main() {
    let args = Args::parse();
    let bin = args
        .cella
        .clone()
        .unwrap_or_else(|| std::env::current_exe().unwrap().with_file_name("cella"));
    assert!(
        bin.exists(),
        "no cella binary at {}: build it with `cargo build --release`",
        bin.display()
    );
    let q = args.quick;
    let n = if q { 10 } else { 50 };
    if args.phases {
        let s = Server::start(&bin, "");
        phases::measure(&s, n);
        return;
    }
    if args.gvisor_only {
        let s = Server::start(&bin, "");
        for x in gvisor_series(&s, &bin, n) {
            println!(
                "{:<22} p50 {:>9.2}   p90 {:>9.2}   n {}   target {}",
                x.name,
                x.p(0.5),
                x.p(0.9),
                x.samples.len(),
                x.target
            );
        }
        return;
    }
    // Task runs, on a server of their own (its agents are commands), before anything else.
    let task_figures = if args.gateway_only {
        tasks::Figures {
            queued_to_running_ms: vec![f64::NAN],
            queued_to_running_cloned_ms: vec![f64::NAN],
            heartbeat_loss_extra_sec: None,
            heartbeat_loss_early_failure: None,
            other_endings: Vec::new(),
        }
    } else {
        let t = Server::start(&bin, tasks::CONFIG);
        let data = t._dir.path().join("data");
        tasks::measure(&t, &data, if q { 10 } else { 30 })
    };
    let print_tasks = || {
        let mut v = task_figures.queued_to_running_ms.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        println!(
            "task_queued_to_running p50 {:.1} ms   p90 {:.1} ms   (10 MB repository, base kept; target p50 <= 300)",
            pct(&v, 0.5),
            pct(&v, 0.9)
        );
        let mut c = task_figures.queued_to_running_cloned_ms.clone();
        c.sort_by(|a, b| a.total_cmp(b));
        println!(
            "task_queued_to_running_cloned p50 {:.1} ms   p90 {:.1} ms   (10 MB repository, a new base commit each: cloned)",
            pct(&c, 0.5),
            pct(&c, 0.9)
        );
        match (
            task_figures.heartbeat_loss_extra_sec,
            &task_figures.heartbeat_loss_early_failure,
        ) {
            (Some(x), _) => {
                println!("task_heartbeat_loss    failed {x:.1} s after the timeout   (target <= 5)")
            }
            (None, Some(why)) => println!(
                "task_heartbeat_loss    not measured: the frozen run failed before its timeout ({why})"
            ),
            (None, None) => println!("task_heartbeat_loss    not measured (the run did not fail)"),
        }
        if !task_figures.other_endings.is_empty() {
            println!(
                "task runs that should have ended cancelled: {} did not: {}",
                task_figures.other_endings.len(),
                task_figures.other_endings.join("; ")
            );
        }
    };
    if args.tasks_only {
        print_tasks();
        return;
    }
    let standin = gateway::StandIn::start();
    let s = Server::start(&bin, &standin.config());
    let mut series: Vec<Series> = Vec::new();

    // The model gateway against its stand-in upstream, directly and through the gateway.
    // Beside the gateway kept full: a cold create + first exec every 100 ms (its rows and the
    // gateway's ledger entries share SQLite's one writer).
    let under_load = |end: Instant| {
        let mut v = Vec::new();
        while Instant::now() < end {
            let t = Instant::now();
            if let Ok(id) = s.create(KEY) {
                s.exec_true(&id);
                v.push(ms(t.elapsed()));
                s.destroy(KEY, &id);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        v
    };
    let gw = gateway::measure(
        &standin,
        &s.url,
        KEY,
        if q { 200 } else { 1000 },
        if q { 3.0 } else { 10.0 },
        &under_load,
    );
    let gw_p50 = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        pct(&v, 0.5)
    };
    let gw_added = gw_p50(&gw.gateway_ms) - gw_p50(&gw.direct_ms);
    let gw_ttfb_added = gw_p50(&gw.gateway_ttfb_ms) - gw_p50(&gw.direct_ttfb_ms);
    let print_gateway = || {
        println!(
            "gateway_whole_ms       direct p50 {:.3}   via gateway p50 {:.3}   added {:.3}   (target added <= 1)",
            gw_p50(&gw.direct_ms),
            gw_p50(&gw.gateway_ms),
            gw_added
        );
        println!(
            "gateway_ttfb_ms        direct p50 {:.3}   via gateway p50 {:.3}   added {:.3}   (target added <= 1)",
            gw_p50(&gw.direct_ttfb_ms),
            gw_p50(&gw.gateway_ttfb_ms),
            gw_ttfb_added
        );
        println!(
            "gateway_rps_32_conns   via gateway {:.0}   direct {:.0}   (target >= 2000)",
            gw.gateway_rps, gw.direct_rps
        );
    };
    if args.gateway_only {
        print_gateway();
        return;
    }

    // Create (wait) then a first `exec true`, cold (no pool for xs); destroy. The figure is of
    // creates SETTLE apart (what the last sample's destroy and the disk pool's refill do in the
    // background is over); the same back to back follows, as a second figure.
    let mut create = Vec::new();
    let mut destroy = Vec::new();
    let mut burst = Vec::new();
    for i in 0..2 * n {
        if i < n {
            std::thread::sleep(SETTLE);
        }
        let t = Instant::now();
        let id = s.create(KEY).expect("create");
        s.exec_true(&id);
        if i < n {
            create.push(ms(t.elapsed()));
        } else {
            burst.push(ms(t.elapsed()));
        }
        let t = Instant::now();
        s.destroy(KEY, &id);
        if i < n {
            destroy.push(ms(t.elapsed()));
        }
    }
    series.push(Series {
        name: "create_exec_cold_ms",
        samples: create,
        target: "p50 <= 12",
    });
    series.push(Series {
        name: "create_exec_cold_burst_ms",
        samples: burst,
        target: "",
    });
    series.push(Series {
        name: "create_exec_cold_under_gateway_load_ms",
        samples: gw.beside_ms.clone(),
        target: "",
    });
    series.push(Series {
        name: "destroy_ms",
        samples: destroy,
        target: "p50 <= 5",
    });

    // The same on the gVisor runtime, where the server has `runsc` (else no row).
    series.extend(gvisor_series(&s, &bin, n));

    // The same from the warm pool (size small): SETTLE apart (the last claim's refill is over),
    // then back to back (each claim beside the refill of the one before).
    let fast_ready = || small_fast_ready(&s);
    let mut warm = Vec::new();
    let mut warm_burst = Vec::new();
    for i in 0..2 * n {
        if i < n {
            std::thread::sleep(SETTLE);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !fast_ready() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let t = Instant::now();
        let id = s.create_size(KEY, "small").expect("create");
        s.exec_true(&id);
        if i < n {
            warm.push(ms(t.elapsed()));
        } else {
            warm_burst.push(ms(t.elapsed()));
        }
        s.destroy(KEY, &id);
    }
    series.push(Series {
        name: "create_exec_warm_ms",
        samples: warm,
        target: "p50 <= 5, p99 <= 15",
    });
    series.push(Series {
        name: "create_exec_warm_burst_ms",
        samples: warm_burst,
        target: "",
    });

    let id = s.create(KEY).expect("create");
    // A warm `1+1` cell (the kernel started by a first cell).
    let cell = || {
        let (st, v) = s.call(
            KEY,
            "POST",
            &format!("/api/v1/sandboxes/{id}/code/run"),
            Some(json!({ "code": "1+1" })),
        );
        assert!(
            st == 200 && v["data"]["result"] == "2",
            "code cell: {st} {v}"
        );
    };
    cell();
    series.push(Series {
        name: "code_cell_ms",
        samples: timed(if q { 30 } else { 200 }, cell),
        target: "p50 <= 5",
    });
    // Fork of a sandbox with 100 MiB of changed files (one copy per fork, source keeps running).
    let write_100mib = |id: &str| {
        let (st, v) = s.call(
            KEY,
            "POST",
            &format!("/api/v1/sandboxes/{id}/exec"),
            Some(json!({ "command": "head -c 104857600 /dev/urandom > /home/user/changed" })),
        );
        assert!(
            st == 200 && v["data"]["exit_code"] == 0,
            "writing 100 MiB: {v}"
        );
    };
    // One fork of `id`: its time and its source's pause; the child is destroyed.
    let fork_one = |id: &str| {
        let t = Instant::now();
        let (st, v) = s.call(
            KEY,
            "POST",
            &format!("/api/v1/sandboxes/{id}/fork"),
            Some(json!({ "count": 1 })),
        );
        let took = ms(t.elapsed());
        assert_eq!(st, 201, "fork: {v}");
        s.destroy(KEY, v["data"][0]["id"].as_str().unwrap_or_default());
        let paused = v["fork"]["source_paused_ms"].as_f64().unwrap_or(f64::NAN);
        (took, paused)
    };
    let src = s.create(KEY).expect("create");
    write_100mib(&src);
    let (mut fork, mut fork_pause) = (Vec::new(), Vec::new());
    for _ in 0..(if q { 5 } else { 20 }) {
        let (took, paused) = fork_one(&src);
        fork.push(took);
        fork_pause.push(paused);
    }
    // A fork right after 100 MiB were written, each of a new sandbox (the first fork after a
    // write syncs the new data through the source's disk and copies it; the forks above, of one
    // source, copy what the first of them read in).
    let (mut fork_fresh, mut fork_fresh_pause) = (Vec::new(), Vec::new());
    for _ in 0..(if q { 3 } else { 8 }) {
        let fresh = s.create(KEY).expect("create");
        write_100mib(&fresh);
        let (took, paused) = fork_one(&fresh);
        fork_fresh.push(took);
        fork_fresh_pause.push(paused);
        s.destroy(KEY, &fresh);
    }
    s.destroy(KEY, &src);
    series.push(Series {
        name: "fork_100mib_ms",
        samples: fork,
        target: "p50 <= 100",
    });
    series.push(Series {
        name: "fork_100mib_after_write_ms",
        samples: fork_fresh,
        target: "p50 <= 100",
    });
    series.push(Series {
        name: "fork_after_write_source_paused_ms",
        samples: fork_fresh_pause,
        target: "",
    });
    series.push(Series {
        name: "fork_source_paused_ms",
        samples: fork_pause,
        target: "",
    });
    series.push(Series {
        name: "exec_rtt_ms",
        samples: timed(if q { 50 } else { 300 }, || s.exec_true(&id)),
        target: "p50 <= 1",
    });
    let (mut pause, mut resume) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        s.call(KEY, "POST", &format!("/api/v1/sandboxes/{id}/pause"), None);
        pause.push(ms(t.elapsed()));
        let t = Instant::now();
        s.call(KEY, "POST", &format!("/api/v1/sandboxes/{id}/resume"), None);
        resume.push(ms(t.elapsed()));
    }
    series.push(Series {
        name: "pause_ms",
        samples: pause,
        target: "p50 <= 10",
    });
    series.push(Series {
        name: "resume_ms",
        samples: resume,
        target: "p50 <= 10",
    });

    // GET requests per second at 32 concurrent connections: by `wrk` where it can be had (the
    // target's figure), and by the bench's own client for comparison with older runs.
    let secs = if q { 2 } else { 5 };
    let rps_own = get_rps(&s.url, &id, secs);
    let rps_wrk = get_rps_wrk(&s.url, &id, secs);
    let rps = rps_wrk.unwrap_or(rps_own);

    // Upload and download of one big file.
    let mb: u64 = if q { 50 } else { 200 };
    let payload = vec![0x5au8; (mb * 1024 * 1024) as usize];
    let t = Instant::now();
    let up = s
        .http
        .put(format!(
            "{}/api/v1/sandboxes/{id}/files?path=/home/user/big",
            s.url
        ))
        .bearer_auth(KEY)
        .body(payload)
        .send()
        .unwrap();
    assert!(up.status().is_success());
    let upload = mb as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut down = s
        .http
        .get(format!(
            "{}/api/v1/sandboxes/{id}/files?path=/home/user/big",
            s.url
        ))
        .bearer_auth(KEY)
        .send()
        .unwrap();
    let got = std::io::copy(&mut down, &mut std::io::sink()).unwrap();
    assert_eq!(got, mb * 1024 * 1024);
    let download = mb as f64 / t.elapsed().as_secs_f64();
    s.destroy(KEY, &id);

    // Host memory per idle sandbox (its cgroup holds the agent and everything inside), and
    // how many idle sandboxes the host holds (spread over workspaces: plan caps are per tenant).
    let idle_n = if q { 20 } else { 100 };
    let density_max: usize = if q { 100 } else { 1000 };
    let mut keys = Vec::new();
    for i in 0..density_max.div_ceil(500) {
        let (_, ws) = s.call(
            KEY,
            "POST",
            "/api/v1/workspaces",
            Some(json!({ "name": format!("bench{i}"), "plan": "enterprise" })),
        );
        let ws_id = ws["data"]["id"].as_str().unwrap().to_string();
        let (_, k) = s.call(
            KEY,
            "POST",
            "/api/v1/api-keys",
            Some(json!({ "workspace_id": ws_id, "name": "bench", "scopes": ["admin"] })),
        );
        keys.push(k["data"]["key"].as_str().unwrap().to_string());
    }
    let mut made: Vec<(String, String)> = Vec::new();
    let mut stop_reason = None;
    while made.len() < density_max {
        let key = keys[made.len() / 500].clone();
        match s.create(&key) {
            Ok(id) => made.push((key, id)),
            Err(e) => {
                stop_reason = Some(e);
                break;
            }
        }
        if made.len() == idle_n {
            std::thread::sleep(Duration::from_secs(2));
        }
    }
    let sample: Vec<f64> = made
        .iter()
        .take(idle_n)
        .filter_map(|(k, id)| {
            s.call(k, "GET", &format!("/api/v1/sandboxes/{id}/usage"), None)
                .1["data"]["memory_mib_now"]
                .as_f64()
        })
        .collect();
    let idle_mib = sample.iter().sum::<f64>() / sample.len().max(1) as f64;
    let density = made.len();
    std::thread::scope(|sc| {
        for chunk in made.chunks(made.len().div_ceil(8).max(1)) {
            let s = &s;
            sc.spawn(move || {
                for (k, id) in chunk {
                    s.destroy(k, id);
                }
            });
        }
    });

    let runc = runc_peer(n);
    let bwrap = bwrap_peer(n);
    series.push(Series {
        name: "peer_spawn_true_ms",
        samples: spawn_peer(if q { 50 } else { 300 }),
        target: "",
    });
    if let Some(b) = spawn_bare_peer(if q { 50 } else { 300 }) {
        series.push(Series {
            name: "peer_spawn_bare_ms",
            samples: b,
            target: "(a program with no C library)",
        });
    }
    if let Some(r) = &runc {
        series.push(Series {
            name: "peer_runc_ms",
            samples: r.clone(),
            target: "",
        });
    }
    if let Some(b) = &bwrap {
        series.push(Series {
            name: "peer_bwrap_ms",
            samples: b.clone(),
            target: "",
        });
    }

    // The server turns it on at start unless told not to; every figure below depends on it.
    let favored = favordynmods_on();
    println!(
        "\nhost: cgroup favordynmods {} (cgroup moves {} for an RCU grace period)",
        if favored { "on" } else { "off" },
        if favored { "do not wait" } else { "may wait" }
    );
    println!(
        "\n{:<22} {:>9} {:>9} {:>9}   target",
        "figure", "p50", "p90", "p99"
    );
    for x in &series {
        println!(
            "{:<22} {:>9.2} {:>9.2} {:>9.2}   {}{}",
            x.name,
            x.p(0.5),
            x.p(0.9),
            x.p(0.99),
            x.target,
            x.met()
                .map(|m| format!(": {}", verdict(m)))
                .unwrap_or_default()
        );
    }
    let find = |name: &str| series.iter().find(|x| x.name == name);
    for (ours, what) in [
        ("create_exec_cold_ms", "cold create+exec"),
        ("create_exec_warm_ms", "warm create+exec"),
    ] {
        let mine = find(ours).map(|x| x.p(0.5)).unwrap_or(f64::NAN);
        for (peer, label) in [
            ("peer_runc_ms", "runc run"),
            ("peer_bwrap_ms", "bwrap --unshare-all"),
        ] {
            if let Some(p) = find(peer) {
                let ratio = mine / p.p(0.5);
                // The targets for a cold create: below runc, within 3x of bwrap.
                let target = match (ours, peer) {
                    ("create_exec_cold_ms", "peer_runc_ms") => {
                        format!("   (target < 1x: {})", verdict(ratio < 1.0))
                    }
                    ("create_exec_cold_ms", "peer_bwrap_ms") => {
                        format!("   (target <= 3x: {})", verdict(ratio <= 3.0))
                    }
                    _ => String::new(),
                };
                println!(
                    "{what} vs {label}: {ratio:.2}x ({mine:.1} ms vs {:.1} ms){target}",
                    p.p(0.5)
                );
            }
        }
    }
    if let (Some(exec), Some(floor)) = (find("exec_rtt_ms"), find("peer_spawn_true_ms")) {
        let (e, f) = (exec.p(0.5), floor.p(0.5));
        println!(
            "exec `true` vs spawning `true` on the host: {:.2}x ({e:.2} ms vs {f:.2} ms: {:.2} ms of Cella)",
            e / f,
            e - f
        );
    }
    if let (Some(t), Some(b)) = (find("peer_spawn_true_ms"), find("peer_spawn_bare_ms")) {
        let cpuid = cpuid_us().map_or(String::new(), |c| {
            format!("; one `cpuid` instruction takes {c:.2} us here")
        });
        println!(
            "process start on this host: `true` {:.2} ms, a program with no C library {:.2} ms \
             (the rest is the dynamic loader and glibc's start{cpuid})",
            t.p(0.5),
            b.p(0.5)
        );
    }
    print_gateway();
    print_tasks();
    println!(
        "api_get_rps            {rps:.0}   ({}; the bench's own client: {rps_own:.0})   (target >= 30000: {})",
        if rps_wrk.is_some() { "wrk -t1 -c32" } else { "no wrk: the bench's own client" },
        verdict(rps >= 30000.0)
    );
    println!("upload_mb_s            {upload:.0}   download_mb_s {download:.0}   (target >= 300)");
    println!(
        "idle_sandbox_host_mib  {idle_mib:.1}   (over {} sandboxes; target <= 8)",
        sample.len()
    );
    println!(
        "density_sandboxes      {density}{}",
        stop_reason
            .as_deref()
            .map(|r| format!("   (stopped: {r})"))
            .unwrap_or_default()
    );

    if let Some(path) = args.json {
        let p = |name: &str, q: f64| {
            find(name)
                .map(|x| json!((x.p(q) * 100.0).round() / 100.0))
                .unwrap_or(Value::Null)
        };
        let task_p50 = {
            let mut v = task_figures.queued_to_running_ms.clone();
            v.sort_by(|a, b| a.total_cmp(b));
            (pct(&v, 0.5) * 100.0).round() / 100.0
        };
        let task_cloned_p50 = {
            let mut c = task_figures.queued_to_running_cloned_ms.clone();
            c.sort_by(|a, b| a.total_cmp(b));
            (pct(&c, 0.5) * 100.0).round() / 100.0
        };
        let mut out = json!({
            "create_exec_warm_ms_p50": p("create_exec_warm_ms", 0.5),
            "create_exec_warm_ms_p99": p("create_exec_warm_ms", 0.99),
            "create_exec_cold_ms_p50": p("create_exec_cold_ms", 0.5),
            "create_exec_cold_ms_p99": p("create_exec_cold_ms", 0.99),
            "create_exec_cold_burst_ms_p50": p("create_exec_cold_burst_ms", 0.5),
            "create_exec_warm_burst_ms_p50": p("create_exec_warm_burst_ms", 0.5),
            "gvisor_create_exec_ms_p50": p("gvisor_create_exec_ms", 0.5),
            "gvisor_exec_ms_p50": p("gvisor_exec_ms", 0.5),
            "gvisor_warm_create_exec_ms_p50": p("gvisor_warm_create_exec_ms", 0.5),
            "gvisor_pause_disk_ms_p50": p("gvisor_pause_disk_ms", 0.5),
            "gvisor_resume_disk_ms_p50": p("gvisor_resume_disk_ms", 0.5),
            "gvisor_snapshot_memory_ms_p50": p("gvisor_snapshot_memory_ms", 0.5),
            "gvisor_create_from_snapshot_ms_p50": p("gvisor_create_from_snapshot_ms", 0.5),
            "gvisor_fork_memory_ms_p50": p("gvisor_fork_memory_ms", 0.5),
            "gvisor_boot_image_create_exec_ms_p50": p("gvisor_boot_image_create_exec_ms", 0.5),
            "gvisor_boot_template_cold_create_exec_ms_p50": p("gvisor_boot_template_cold_create_exec_ms", 0.5),
            "exec_rtt_ms_p50": p("exec_rtt_ms", 0.5),
            "exec_rtt_ms_p99": p("exec_rtt_ms", 0.99),
            "destroy_ms_p50": p("destroy_ms", 0.5),
            "pause_ms_p50": p("pause_ms", 0.5),
            "resume_ms_p50": p("resume_ms", 0.5),
            "fork_100mib_ms_p50": p("fork_100mib_ms", 0.5),
            "idle_sandbox_host_mib": (idle_mib * 10.0).round() / 10.0,
            "density_sandboxes": density,
            "code_cell_ms_p50": p("code_cell_ms", 0.5),
            "api_get_rps": rps.round(),
            "api_get_rps_own_client": rps_own.round(),
            "api_get_rps_wrk": rps_wrk.map(|r| r.round()),
            "upload_mb_s": upload.round(),
            "download_mb_s": download.round(),
            "peer_runc_ms_p50": p("peer_runc_ms", 0.5),
            "peer_bwrap_ms_p50": p("peer_bwrap_ms", 0.5),
            "peer_spawn_true_ms_p50": p("peer_spawn_true_ms", 0.5),
            "gateway_added_ms_p50": (gw_added * 1000.0).round() / 1000.0,
            "gateway_ttfb_added_ms_p50": (gw_ttfb_added * 1000.0).round() / 1000.0,
            "gateway_rps_32": gw.gateway_rps.round(),
            "task_queued_to_running_ms_p50": task_p50,
            "task_queued_to_running_cloned_ms_p50": task_cloned_p50,
            "task_heartbeat_loss_extra_sec": task_figures.heartbeat_loss_extra_sec,
            "cgroup_favordynmods": favored,
            "quick": q,
        });
        // Beside the rest (one `json!` of them all is past the macro's recursion limit).
        out["fork_100mib_after_write_ms_p50"] = json!(p("fork_100mib_after_write_ms", 0.5));
        out["peer_spawn_bare_ms_p50"] = json!(p("peer_spawn_bare_ms", 0.5));
        out["gvisor_first_exec_later_ms_p50"] = json!(p("gvisor_first_exec_later_ms", 0.5));
        out["gvisor_boot_image_warm_create_exec_ms_p50"] =
            json!(p("gvisor_boot_image_warm_create_exec_ms", 0.5));
        out["create_exec_cold_under_gateway_load_ms_p50"] =
            json!(p("create_exec_cold_under_gateway_load_ms", 0.5));
        out["host_cpuid_us"] = json!(cpuid_us().map(|c| (c * 100.0).round() / 100.0));
        std::fs::write(&path, serde_json::to_vec_pretty(&out).unwrap()).expect("writing the JSON");
        println!("figures written to {}", path.display());
    }
}
