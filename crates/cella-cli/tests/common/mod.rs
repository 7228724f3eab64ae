//! The test harness: starts the real `cella` binary as a server on a free port with a fresh data
//! directory, talks to it over HTTP, and afterwards clears every sandbox it left on the host.
//!
//! Unit tests sit next to the code (and the server's, over the fake driver, in
//! `cella-server/src/tests/`, without root). The integration suites here run the real binary as a
//! server and talk to it as a client would; each file's module doc says what it covers. Test
//! servers keep no warm pool unless a test asks for one (`[pool]` in its configuration): every
//! test's server would otherwise boot sandboxes ahead. Suites that need programs the host may not
//! have (a registry and `skopeo` for `images.rs`, Chromium for the browser test of previews) skip
//! those tests when they are missing. `bash .ci/run`, as root, installs what the tests need, runs
//! the Rust tests, then the kernels' driver tests (`crates/cella-agent/kernels/test_kernels.py`,
//! which drive `python.py` and `node.js` over their protocol, with no sandbox and no server), then
//! the TypeScript and Python SDKs' suites against the server just built.
#![allow(dead_code)]

use reqwest::blocking::Client;
use reqwest::header::HeaderMap;
use reqwest::Method;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const KEY: &str = "cella_test_admin_key_0123456789";

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cella")
}

pub struct R {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Value,
}

impl R {
    pub fn data(&self) -> &Value {
        &self.body["data"]
    }
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
    /// Asserts the exact error envelope, its status and code, and an `x-request-id`.
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "body: {}", self.body);
        let obj = self.body.as_object().expect("error body is an object");
        assert_eq!(
            obj.keys().collect::<Vec<_>>(),
            vec!["error"],
            "body: {}",
            self.body
        );
        let err = self.body["error"].as_object().expect("error object");
        let mut keys: Vec<&String> = err.keys().collect();
        keys.sort();
        assert_eq!(keys, vec!["code", "details", "message"]);
        assert_eq!(self.code(), code, "body: {}", self.body);
        assert!(!err["message"].as_str().unwrap_or("").is_empty());
        assert!(err["details"].is_null() || err["details"].is_object());
        assert!(self.headers.contains_key("x-request-id"));
    }
}

pub struct Server {
    child: Option<Child>,
    pub url: String,
    pub port: u16,
    pub dir: tempfile::TempDir,
    http: Client,
    /// Extra environment of the server process (`start_env`); `restart_with_env` changes it.
    env: Vec<(String, String)>,
    /// The executable started: the build's, or one a test put elsewhere (`start_exe`).
    pub exe: PathBuf,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Server {
    pub fn start() -> Server {
        Server::start_with("")
    }

    /// Starts a server whose config file holds `config` (TOML).
    pub fn start_with(config: &str) -> Server {
        Server::start_env(config, &[])
    }

    /// Starts a server from executable `exe` (a test that replaces it as an upgrade does).
    pub fn start_exe(exe: &Path) -> Server {
        Server::start_full("", &[], exe)
    }

    /// Starts a server with `config` (TOML) and these extra environment variables.
    pub fn start_env(config: &str, env: &[(&str, &str)]) -> Server {
        Server::start_full(config, env, Path::new(bin()))
    }

    fn start_full(config: &str, env: &[(&str, &str)], exe: &Path) -> Server {
        let dir = tempfile::Builder::new()
            .prefix("cella-test-")
            .tempdir()
            .unwrap();
        // No warm pool unless a test asks for one: every test's server would boot sandboxes.
        let config = if config.contains("[pool]") {
            config.to_string()
        } else {
            format!("{config}\n[pool]\ndefault = 0\nsizes = {{}}\n")
        };
        std::fs::write(dir.path().join("config.toml"), config).unwrap();
        let port = free_port();
        let mut s = Server {
            child: None,
            url: format!("http://127.0.0.1:{port}"),
            port,
            dir,
            http: Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            exe: exe.to_path_buf(),
        };
        s.spawn();
        s
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .unwrap();
        let child = Command::new(&self.exe)
            .args(["serve", "--listen", &format!("127.0.0.1:{}", self.port)])
            .arg("--data-dir")
            .arg(self.data_dir())
            .arg("--config")
            .arg(self.dir.path().join("config.toml"))
            .env("CELLA_BOOTSTRAP_KEY", KEY)
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = self.http.get(format!("{}/healthz", self.url)).send() {
                if r.status().as_u16() == 200 {
                    return;
                }
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("server exited with {st}: {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "server did not become healthy: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    pub fn server_pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// `kill -9` of the server process.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A clean stop (SIGTERM), waiting for the server to exit.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Starts the server again (after it exited, or `kill -9` of it) with this extra
    /// environment instead of the one it had.
    pub fn restart_with_env(&mut self, env: &[(&str, &str)]) {
        self.kill9();
        self.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.spawn();
    }

    /// Waits up to `secs` for the server process to end by itself (it is not killed here);
    /// answers how it ended, or `None` if it still runs.
    pub fn wait_exit(&mut self, secs: u64) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return Some(st);
            }
            if self.child.is_none() || Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn req(&self, method: &str, path: &str, key: Option<&str>, body: Option<&Value>) -> R {
        self.raw(
            method,
            path,
            key,
            body.map(|b| b.to_string().into_bytes()),
            &[],
        )
    }

    pub fn raw(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<Vec<u8>>,
        headers: &[(&str, &str)],
    ) -> R {
        self.try_raw(method, path, key, body, headers).unwrap()
    }

    /// A request whose failure to get an answer (the server died meanwhile) is an `Err`.
    pub fn try_req(&self, method: &str, path: &str, body: Option<&Value>) -> reqwest::Result<R> {
        self.try_raw(
            method,
            path,
            Some(KEY),
            body.map(|b| b.to_string().into_bytes()),
            &[],
        )
    }

    pub fn try_raw(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<Vec<u8>>,
        headers: &[(&str, &str)],
    ) -> reqwest::Result<R> {
        let mut rb = self.http.request(
            Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{}{}", self.url, path),
        );
        if let Some(k) = key {
            rb = rb.bearer_auth(k);
        }
        if let Some(b) = body {
            rb = rb.header("content-type", "application/json").body(b);
        }
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        let res = rb.send()?;
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let text = res.text()?;
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Ok(R {
            status,
            headers,
            body,
        })
    }

    pub fn get(&self, path: &str) -> R {
        self.req("GET", path, Some(KEY), None)
    }
    pub fn post(&self, path: &str, body: Value) -> R {
        self.req("POST", path, Some(KEY), Some(&body))
    }
    pub fn delete(&self, path: &str) -> R {
        self.req("DELETE", path, Some(KEY), None)
    }

    /// Creates a sandbox (waiting for it) and returns its id.
    pub fn create(&self, body: Value) -> String {
        self.create_as(KEY, body)
    }

    pub fn create_as(&self, key: &str, body: Value) -> String {
        let r = self.req("POST", "/api/v1/sandboxes", Some(key), Some(&body));
        assert_eq!(r.status, 201, "create failed: {}\n{}", r.body, self.log());
        assert_eq!(r.data()["state"], "running");
        r.data()["id"].as_str().unwrap().to_string()
    }

    /// Runs a shell command line in a sandbox; returns the exec result.
    pub fn sh(&self, id: &str, command: &str) -> Value {
        self.exec(id, json!({ "command": command }))
    }

    pub fn exec(&self, id: &str, body: Value) -> Value {
        let r = self.post(&format!("/api/v1/sandboxes/{id}/exec"), body);
        assert_eq!(r.status, 200, "exec failed: {}", r.body);
        r.data().clone()
    }

    /// Makes a workspace and a key with these scopes in it; returns (workspace id, key).
    pub fn workspace_key(&self, plan: &str, scopes: &[&str]) -> (String, String) {
        let ws = self.post(
            "/api/v1/workspaces",
            json!({ "name": "t", "plan": plan, "kind": "organization" }),
        );
        assert_eq!(ws.status, 201, "{}", ws.body);
        let ws_id = ws.data()["id"].as_str().unwrap().to_string();
        let k = self.post(
            "/api/v1/api-keys",
            json!({ "workspace_id": ws_id, "name": "k", "scopes": scopes }),
        );
        assert_eq!(k.status, 201, "{}", k.body);
        (ws_id, k.data()["key"].as_str().unwrap().to_string())
    }
}

/// Cgroup directories of a sandbox, in every mounted hierarchy.
pub fn cgroup_dirs(id: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let roots: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    for root in roots.into_iter().chain([PathBuf::from("/sys/fs/cgroup")]) {
        let cella = root.join("cella");
        if let Ok(instances) = std::fs::read_dir(&cella) {
            for inst in instances.flatten() {
                let p = inst.path().join(id);
                if p.is_dir() {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// The value of a file of sandbox `id`'s cgroup: `v1` (hierarchy, file) on cgroup v1, `v2`
/// on v2; None where there is none.
pub fn cgroup_value(id: &str, v1: (&str, &str), v2: &str) -> Option<String> {
    for d in cgroup_dirs(id) {
        let parent = d
            .parent()
            .and_then(|p| p.parent())
            .and_then(|p| p.parent())
            .map(|p| p.to_path_buf());
        let file = if parent.as_deref() == Some(Path::new("/sys/fs/cgroup")) && d.join(v2).exists()
        {
            d.join(v2)
        } else if parent.as_deref() == Some(&Path::new("/sys/fs/cgroup").join(v1.0)) {
            d.join(v1.1)
        } else {
            continue;
        };
        if let Ok(t) = std::fs::read_to_string(file) {
            return Some(t.trim().to_string());
        }
    }
    None
}

/// Waits until `done()` holds, for at most 30 s, then fails naming `what`. A destroy answers
/// once its row is `destroyed`; the teardown on the host (processes, cgroups, files) ends just
/// after, so what a test checks of the host after a destroy is waited for with this.
pub fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "still not so after 30 s: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until sandbox `id` has no process and no cgroup left on the host (see
/// [`eventually`]).
pub fn wait_gone(id: &str) {
    eventually(
        &format!("the processes and cgroups of {id} are gone"),
        || sandbox_pids(id).is_empty() && cgroup_dirs(id).is_empty(),
    );
}

/// Host pids of every process of a sandbox.
pub fn sandbox_pids(id: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for d in cgroup_dirs(id) {
        if let Ok(t) = std::fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(t.lines().filter_map(|l| l.parse::<i32>().ok()));
        }
    }
    pids.sort();
    pids.dedup();
    pids
}

/// Namespace links (`mnt:[...]`, `net:[...]`, ...) of a process.
pub fn namespaces(pid: i32) -> Vec<String> {
    ["mnt", "net", "pid", "uts", "ipc", "cgroup", "user"]
        .iter()
        .filter_map(|ns| std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).ok())
        .map(|p| p.display().to_string())
        .collect()
}

/// Every namespace link in use by any process on the host.
pub fn namespaces_in_use() -> std::collections::HashSet<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .filter(|p| !waiting_launcher(*p))
        .flat_map(namespaces)
        .collect()
}

/// Pids whose parent is `pid`.
pub fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // The command name is in parentheses and may hold spaces; the fields after it are fixed.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // fields[0] is the state, fields[1] the parent; a zombie the server has not reaped yet
        // counts too (it is a leak if it stays).
        if fields.get(1).and_then(|f| f.parse::<i32>().ok()) == Some(pid) {
            out.push(p);
        }
    }
    out
}

/// Whether `pid` is a launcher a server keeps waiting for its next boot (`cella __sandbox-init`
/// outside every sandbox's cgroup). It made fresh namespaces of its own, so one whose number a
/// gone sandbox had (the kernel hands a freed number to the next namespace made) is not that
/// sandbox's.
pub fn waiting_launcher(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == b"cella\0__sandbox-init\0")
        && std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .is_ok_and(|c| !c.contains("/cella/"))
}

/// The server's nftables helper (`cella __nft`, `cella_runtime::nftlib`): one per server, for
/// the server's life.
pub fn nft_helper(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == b"cella\0__nft\0")
}

/// Kills what a test's server left running and removes its cgroups (sandboxes outlive their
/// server by design, so a test must clear them itself).
fn janitor(data: &Path) {
    // Twice: a launcher the killed server had already given its configuration finishes its
    // sandbox a few milliseconds later.
    clear(data);
    std::thread::sleep(Duration::from_millis(300));
    clear(data);
}

fn clear(data: &Path) {
    let mut ids: Vec<String> = std::fs::read_dir(data.join("sandboxes"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default();
    // And whatever has a cgroup under the server's instance (pool and build sandboxes too).
    if let Ok(instance) = std::fs::read_to_string(data.join("instance-id")) {
        let roots = std::fs::read_dir("/sys/fs/cgroup")
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_else(|_| Vec::new());
        for root in roots.into_iter().chain([PathBuf::from("/sys/fs/cgroup")]) {
            if let Ok(rd) = std::fs::read_dir(root.join("cella").join(instance.trim())) {
                for e in rd.flatten() {
                    if e.path().is_dir() {
                        ids.push(e.file_name().to_string_lossy().to_string());
                    }
                }
            }
        }
    }
    ids.sort();
    ids.dedup();
    for id in ids {
        for _ in 0..100 {
            let pids = sandbox_pids(&id);
            if pids.is_empty() {
                break;
            }
            for p in pids {
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            // A paused sandbox is frozen, and frozen processes die only once thawed.
            for d in cgroup_dirs(&id) {
                let _ = std::fs::write(d.join("freezer.state"), "THAWED");
                let _ = std::fs::write(d.join("cgroup.freeze"), "0");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for d in cgroup_dirs(&id) {
            remove_cgroup_tree(&d);
        }
    }
    // The server's own cgroup parent, `cella/<instance>`, in every hierarchy.
    if let Ok(instance) = std::fs::read_to_string(data.join("instance-id")) {
        remove_firewall_chains(instance.trim());
        let roots = std::fs::read_dir("/sys/fs/cgroup")
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_else(|_| Vec::new());
        for root in roots.into_iter().chain([PathBuf::from("/sys/fs/cgroup")]) {
            let _ = std::fs::remove_dir(root.join("cella").join(instance.trim()));
        }
    }
}

/// Removes a cgroup directory and the cgroups below it (the agent's exec cgroups), deepest first.
fn remove_cgroup_tree(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        janitor(&self.data_dir());
        unmount_under(&self.data_dir());
    }
}

/// Detaches every mount under `data` (a linked gVisor sandbox's kept network namespace, bound
/// in its directory, outlives a killed server: the namespace and its link would stay on the
/// host, and the temporary directory could not be removed).
fn unmount_under(data: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<&str> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(data))
        .collect();
    points.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in points {
        if let Ok(c) = std::ffi::CString::new(m) {
            // SAFETY: umount2 of a path we own, with a NUL-terminated string.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Parses a server-sent-event body into (event, data) pairs; every data is JSON.
pub fn sse(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter_map(|block| {
            let mut name = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = Some(v.trim().to_string());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            Some((name?, serde_json::from_str(&data).ok()?))
        })
        .collect()
}

/// Whether server `instance`'s floor set is in the firewall.
pub fn floor_set_exists(instance: &str) -> bool {
    Command::new("nft")
        .args(["list", "set", "inet", "cella", &format!("floor_{instance}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Names of the firewall chains of server `instance` (`sb_<instance>_<sandbox id>`).
pub fn firewall_chains(instance: &str) -> Vec<String> {
    let out = Command::new("nft")
        .args(["-j", "list", "chains", "inet"])
        .output();
    let Ok(out) = out else { return Vec::new() };
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let prefix = format!("sb_{instance}_");
    v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o.get("chain"))
        .filter(|c| c["table"] == "cella")
        .filter_map(|c| c["name"].as_str())
        .filter(|n| n.starts_with(&prefix))
        .map(String::from)
        .collect()
}

/// Removes what a killed test server left in the firewall (its map entries, chains and floor
/// set: the sets of servers gone pile up otherwise, and every `nft` run reads them all).
fn remove_firewall_chains(instance: &str) {
    remove_chains(instance);
    let _ = Command::new("nft")
        .args([
            "delete",
            "set",
            "inet",
            "cella",
            &format!("floor_{instance}"),
        ])
        .stderr(Stdio::null())
        .status();
}

fn remove_chains(instance: &str) {
    let chains = firewall_chains(instance);
    if chains.is_empty() {
        return;
    }
    let out = Command::new("nft")
        .args(["-j", "list", "map", "inet", "cella", "by_iif"])
        .output();
    let mut script = String::new();
    if let Ok(out) = out {
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        for m in v["nftables"].as_array().into_iter().flatten() {
            for e in m["map"]["elem"].as_array().into_iter().flatten() {
                // The key is the interface's name while it exists, else its index (a number,
                // or a string of digits, which must be written bare).
                let key = match &e[0] {
                    Value::String(k) if k.parse::<u32>().is_ok() => k.clone(),
                    Value::String(k) => format!("\"{k}\""),
                    Value::Number(n) => n.to_string(),
                    _ => continue,
                };
                if let Some(t) = e[1]["jump"]["target"].as_str() {
                    if chains.iter().any(|c| c == t) {
                        script += &format!("delete element inet cella by_iif {{ {key} }}\n");
                    }
                }
            }
        }
    }
    for c in &chains {
        script += &format!("flush chain inet cella {c}\ndelete chain inet cella {c}\n");
    }

    if let Ok(mut child) = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
    {
        use std::io::Write;
        let _ = child.stdin.take().unwrap().write_all(script.as_bytes());
        let _ = child.wait();
    }
}

/// Waits for a template build to end; returns the build.
pub fn wait_build(s: &Server, key: &str, template: &str, build: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let r = s.req(
            "GET",
            &format!("/api/v1/templates/{template}/builds/{build}"),
            Some(key),
            None,
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let st = r.data()["state"].as_str().unwrap().to_string();
        if st == "ready" || st == "failed" {
            return r.data().clone();
        }
        assert!(
            Instant::now() < deadline,
            "the build did not end: {}",
            r.body
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts a template build of `spec` and waits for it to end.
pub fn build(s: &Server, key: &str, spec: &Value) -> Value {
    let r = s.req("POST", "/api/v1/templates", Some(key), Some(spec));
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.data()["state"], "queued");
    let id = r.data()["id"].as_str().unwrap().to_string();
    wait_build(s, key, spec["id"].as_str().unwrap(), &id)
}

/// Starts `cella serve` with `config` (TOML) on a fresh data directory, expects it to refuse to
/// start, and returns what it printed on standard error.
pub fn serve_refuses(config: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    let out = Command::new(bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--config")
        .arg(dir.path().join("config.toml"))
        .env("CELLA_BOOTSTRAP_KEY", KEY)
        .output()
        .unwrap();
    assert!(!out.status.success(), "the server started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Whether this host has `runsc` (the gVisor runtime); says so on stderr when it has not, for
/// the gVisor tests that then skip.
pub fn have_runsc() -> bool {
    let found = ["/usr/bin/runsc", "/usr/sbin/runsc", "/usr/local/bin/runsc"]
        .iter()
        .any(|p| std::path::Path::new(p).exists());
    if !found {
        eprintln!("skipped: runsc is not installed");
    }
    found
}

/// A terminal session over the API's WebSocket.
pub type Ws = tungstenite::WebSocket<std::net::TcpStream>;

/// Opens `GET .../pty?{query}` of sandbox `id` as the admin key.
pub fn pty_open(s: &Server, id: &str, query: &str) -> Ws {
    let url = format!(
        "ws://127.0.0.1:{}/api/v1/sandboxes/{id}/pty?{query}",
        s.port
    );
    let mut req = tungstenite::client::IntoClientRequest::into_client_request(url).unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {KEY}").parse().unwrap());
    let stream = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    // The upgrade may take a while under load (a 200 ms wait here once failed the handshake);
    // the reads after it poll in short steps.
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let (ws, resp) = tungstenite::client(req, stream).unwrap();
    assert_eq!(resp.status().as_u16(), 101);
    ws.get_ref()
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    ws
}

/// Sends keystrokes.
pub fn pty_send(ws: &mut Ws, text: &str) {
    ws.send(tungstenite::Message::Binary(
        text.as_bytes().to_vec().into(),
    ))
    .unwrap();
}

/// Resizes the terminal to `cols` x `rows` while a foreground program waits for `SIGWINCH`
/// (as a full-screen program does) and checks that it got the signal and read the new size
/// (the agent signals once the size reads back as set); the program then ends.
pub fn pty_resize_signals(ws: &mut Ws, cols: u16, rows: u16) {
    pty_send(
        ws,
        "sh -c 'trap \"stty size; exit 0\" WINCH; echo WAITING-$((6*7)); while :; do sleep 0.1; done'\n",
    );
    pty_read_until(ws, "WAITING-42");
    ws.send(tungstenite::Message::Text(
        serde_json::json!({ "resize": { "cols": cols, "rows": rows } })
            .to_string()
            .into(),
    ))
    .unwrap();
    pty_read_until(ws, &format!("{rows} {cols}"));
}

/// A command listing its own descriptors (gVisor's `ls /proc/self/fd` fails with EINVAL).
pub const LIST_OWN_FDS: &str =
    "python3 -c \"import os; print(sorted(int(f) for f in os.listdir('/proc/self/fd')))\"";

/// Checks that a program of the terminal holds no descriptor of the agent's: only the terminal
/// (0-2) and the one Python opens to list them (3).
pub fn pty_only_standard_fds(ws: &mut Ws) {
    pty_send(ws, &format!("{LIST_OWN_FDS}\n"));
    pty_read_until(ws, "[0, 1, 2, 3]");
}

/// Reads terminal output until `want` shows up (or fails after a while); returns all of it.
pub fn pty_read_until(ws: &mut Ws, want: &str) -> String {
    match pty_read_until_or(ws, want, Duration::from_secs(15)) {
        Some(screen) => screen,
        None => panic!("never saw {want:?} within 15 s"),
    }
}

/// Reads terminal output until `want` shows up; `None` (after printing the screen) if it did
/// not within `wait`.
pub fn pty_read_until_or(ws: &mut Ws, want: &str, wait: Duration) -> Option<String> {
    let mut screen = String::new();
    pty_read_more(ws, &mut screen, want, wait).then_some(screen)
}

/// Reads terminal output onto `screen` until the whole of it shows `want` (output read before,
/// in the same frame as what was waited for then, counts); false (after printing the screen)
/// if it did not within `wait`.
pub fn pty_read_more(ws: &mut Ws, screen: &mut String, want: &str, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    while !screen.contains(want) && Instant::now() < deadline {
        match ws.read() {
            Ok(tungstenite::Message::Binary(b)) => screen.push_str(&String::from_utf8_lossy(&b)),
            Ok(tungstenite::Message::Text(t)) => screen.push_str(t.as_str()),
            Ok(tungstenite::Message::Close(_)) => break,
            Ok(_) => {}
            Err(tungstenite::Error::Io(e))
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
    if screen.contains(want) {
        return true;
    }
    eprintln!("never saw {want:?}; the screen had:\n{screen}");
    false
}

/// The ids the server logged as ready pool sandboxes of `runtime`, oldest first.
pub fn ready_in_log(s: &Server, runtime: &str) -> Vec<String> {
    let tail = format!(", {runtime})");
    s.log()
        .lines()
        .filter_map(|l| {
            let rest = l.split("warm pool sandbox ").nth(1)?;
            let (id, what) = rest.split_once(" ready (")?;
            what.contains(&tail).then(|| id.to_string())
        })
        .collect()
}

/// Waits until the server has logged `n` ready pool sandboxes of `runtime`; answers the last.
pub fn wait_ready(s: &Server, runtime: &str, n: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ids = ready_in_log(s, runtime);
        if ids.len() >= n {
            return ids[n - 1].clone();
        }
        assert!(
            Instant::now() < deadline,
            "no {n}th {runtime} pool sandbox: {}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Processes on the host whose command line names `needle`.
pub fn host_processes_naming(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if e.file_name().to_string_lossy().parse::<i32>().is_err() {
            continue;
        }
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) {
                out.push(cmd);
            }
        }
    }
    out
}

/// Mount lines, in any process's view, that name `needle`.
pub fn mounts_naming(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if e.file_name().to_string_lossy().parse::<i32>().is_err() {
            continue;
        }
        if let Ok(m) = std::fs::read_to_string(e.path().join("mountinfo")) {
            out.extend(m.lines().filter(|l| l.contains(needle)).map(str::to_string));
        }
    }
    out
}
