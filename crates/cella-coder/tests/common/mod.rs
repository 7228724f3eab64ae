//! Shared by the tests: a small scripted HTTP server (the heartbeat receiver and the stand-in
//! for the model provider are both made of it), a real git repository in a temp dir, and the
//! supervisor as a separate process (this test binary run again, so that signals reach it and
//! not the test harness).
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use std::sync::{Arc, Mutex};

#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// Lower-case names.
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

pub struct Response {
    pub status: u16,
    pub body: String,
}

impl Response {
    pub fn json(status: u16, v: serde_json::Value) -> Response {
        Response {
            status,
            body: v.to_string(),
        }
    }
    pub fn empty(status: u16) -> Response {
        Response {
            status,
            body: String::new(),
        }
    }
}

type Handler = Box<dyn FnMut(&Request) -> Response + Send>;

/// An HTTP/1.1 server on 127.0.0.1 answering every request with `handler` (one request per
/// connection, `Connection: close`), recording the requests.
pub struct Stub {
    pub url: String,
    pub requests: Arc<Mutex<Vec<Request>>>,
}

impl Stub {
    pub fn start(handler: impl FnMut(&Request) -> Response + Send + 'static) -> Stub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let recorded = requests.clone();
        let handler: Arc<Mutex<Handler>> = Arc::new(Mutex::new(Box::new(handler)));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let handler = handler.clone();
                let recorded = recorded.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut parts = line.split_whitespace();
                    let method = parts.next().unwrap_or("").to_string();
                    let path = parts.next().unwrap_or("").to_string();
                    let mut headers = HashMap::new();
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        let h = h.trim_end();
                        if h.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                        }
                    }
                    let len: usize = headers
                        .get("content-length")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    let mut body = vec![0; len];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let req = Request {
                        method,
                        path,
                        headers,
                        body,
                    };
                    let resp = (handler.lock().unwrap())(&req);
                    recorded.lock().unwrap().push(req);
                    let reason = match resp.status {
                        200 => "OK",
                        204 => "No Content",
                        402 => "Payment Required",
                        410 => "Gone",
                        _ => "Status",
                    };
                    let mut out = stream;
                    let _ = write!(
                        out,
                        "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                        resp.status,
                        reason,
                        resp.body.len(),
                        resp.body
                    );
                    let _ = out.flush();
                });
            }
        });
        Stub { url, requests }
    }

    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

/// A heartbeat receiver: 204 to every heartbeat, or 410 from the `gone_after`-th on.
pub fn heartbeat_receiver(gone_after: Option<usize>) -> Stub {
    let mut n = 0;
    Stub::start(move |_req| {
        n += 1;
        match gone_after {
            Some(g) if n >= g => Response::json(
                410,
                serde_json::json!({"error": {"code": "GONE", "message": "the run is over", "details": {}}}),
            ),
            _ => Response::empty(204),
        }
    })
}

pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=Test", "-c", "user.email=test@localhost"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A git repository with a small Python project and `test.sh`; (dir, base sha).
pub fn repo() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    git(p, &["init", "-q", "-b", "main"]);
    std::fs::create_dir_all(p.join("src")).unwrap();
    std::fs::write(
        p.join("src/app.py"),
        "def greet(name):\n    return 'Hello ' + name\n",
    )
    .unwrap();
    std::fs::write(p.join("README.md"), "# demo\n").unwrap();
    std::fs::write(
        p.join("test.sh"),
        "grep -q \"Hello, \" src/app.py && echo 'tests passed' || { echo 'tests failed'; exit 1; }\n",
    )
    .unwrap();
    git(p, &["add", "-A"]);
    git(p, &["commit", "-q", "-m", "base"]);
    let base = git(p, &["rev-parse", "HEAD"]).trim().to_string();
    (dir, base)
}

pub const TOKEN: &str = "sbx_test_token_4f1c";

/// The supervisor in a process of its own: this test binary again, running only the test
/// `child_entry` (which calls `cella_coder::main`) with the run's environment.
pub fn supervisor_command(
    workdir: &Path,
    heartbeat_url: &str,
    base: &str,
    argv: &[&str],
    extra_env: &[(&str, &str)],
) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env("CELLA_CODER_CHILD", "1")
        .env("CELLA_CODER_ARGV", serde_json::to_string(&argv).unwrap())
        .env("CELLA_TASK", "a task")
        .env("CELLA_TASK_ID", "task_test")
        .env(
            "CELLA_HEARTBEAT_URL",
            format!("{heartbeat_url}/gateway/tasks/heartbeat"),
        )
        .env("CELLA_HEARTBEAT_SEC", "1")
        .env("OPENAI_API_KEY", TOKEN)
        .env("CELLA_AGENT_KIND", "command")
        .env("CELLA_BASE_SHA", base)
        .env("CELLA_WORKDIR", workdir);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd
}

/// Starts the supervisor with stdout and stderr piped.
pub fn spawn_supervisor(
    workdir: &Path,
    heartbeat_url: &str,
    base: &str,
    argv: &[&str],
    extra_env: &[(&str, &str)],
) -> Child {
    supervisor_command(workdir, heartbeat_url, base, argv, extra_env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The rest of a child's output (after it exited).
pub fn output_of(child: &mut Child) -> String {
    let mut s = String::new();
    if let Some(mut o) = child.stdout.take() {
        o.read_to_string(&mut s).unwrap();
    }
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut s).unwrap();
    }
    s
}

/// What `child_entry` does in the child.
pub fn child_main() {
    if std::env::var("CELLA_CODER_CHILD").as_deref() != Ok("1") {
        return;
    }
    let argv: Vec<String> =
        serde_json::from_str(&std::env::var("CELLA_CODER_ARGV").unwrap()).unwrap();
    std::process::exit(cella_coder::main(argv));
}

/// Waits (with a generous guard against a hang, not a timing assertion) until `cond` holds.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let guard = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !cond() {
        assert!(std::time::Instant::now() < guard, "never happened: {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Waits for `child` to exit (guarded against a hang); its exit code or 128+signal.
pub fn wait_exit(child: &mut Child) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    let mut status = None;
    wait_until("the supervisor exits", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    let s = status.unwrap();
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
}

pub fn process_exists(pid: i32) -> bool {
    PathBuf::from(format!("/proc/{pid}")).exists()
}
