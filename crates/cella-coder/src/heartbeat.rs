//! Heartbeats: `POST CELLA_HEARTBEAT_URL` with `Authorization: Bearer <token>` and a
//! [`cella_types::TaskProgress`] body, every interval, from a thread of its own. The server
//! answers 204; 410 once the run is over (the supervisor then stops the agent).
//!
//! The first heartbeat goes out at once, then one every `CELLA_HEARTBEAT_SEC` seconds, and a
//! last one with the final counts when the agent has ended. The counts: `steps` from the
//! built-in agent's turns; `commits` (`git rev-list --count BASE..HEAD`) and `files_changed`
//! (`git diff --name-only BASE`, the working tree against the base) from git in the checkout,
//! run without taking git's optional locks (so they never get in the agent's way) and with a
//! short timeout (a slow git never delays a heartbeat: the last counts are sent again).
//! A refused or failed heartbeat is reported once per kind on standard error (the live log),
//! never with the token, and retried at the next interval.
//!
//! HTTP: reqwest's blocking client (already a dependency of the workspace, rustls for TLS,
//! widely used and maintained); a plain thread needs no async runtime of its own. Proxy
//! variables are ignored: the gateway is always reached directly.

use crate::{proc, Control, Options};
use cella_types::TaskProgress;
use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long one git count may take.
const GIT_TIMEOUT: Duration = Duration::from_secs(2);

/// The running heartbeat thread.
pub struct Heartbeat {
    done: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

struct Sender {
    client: Option<reqwest::blocking::Client>,
    url: String,
    token: String,
    workdir: PathBuf,
    base_sha: Option<String>,
    control: Control,
    last: TaskProgress,
    reported: HashSet<String>,
}

impl Heartbeat {
    /// Starts the thread; the first heartbeat goes out at once.
    pub fn start(options: &Options, control: Control) -> Heartbeat {
        let interval = Duration::from_secs(options.heartbeat_sec.max(1));
        let client = reqwest::blocking::Client::builder()
            .no_proxy()
            .timeout(
                interval
                    .min(Duration::from_secs(10))
                    .max(Duration::from_secs(2)),
            )
            .build()
            .map_err(|e| eprintln!("cella: no heartbeats: {}", e.without_url()))
            .ok();
        let mut sender = Sender {
            client,
            url: options.heartbeat_url.clone(),
            token: options.token.clone(),
            workdir: options.workdir.clone(),
            base_sha: options.base_sha.clone(),
            control,
            last: TaskProgress::default(),
            reported: HashSet::new(),
        };
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let done2 = done.clone();
        let thread = std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || {
                let (lock, cv) = &*done2;
                loop {
                    if !sender.beat() {
                        // 410: the run is over; no more heartbeats.
                        return;
                    }
                    let deadline = Instant::now() + interval;
                    let Ok(mut finished) = lock.lock() else {
                        return;
                    };
                    while !*finished {
                        let now = Instant::now();
                        if now >= deadline {
                            break;
                        }
                        finished = match cv.wait_timeout(finished, deadline - now) {
                            Ok((g, _)) => g,
                            Err(_) => return,
                        };
                    }
                    if *finished {
                        drop(finished);
                        // The final counts.
                        sender.beat();
                        return;
                    }
                }
            })
            .map_err(|e| eprintln!("cella: no heartbeats: {e}"))
            .ok();
        Heartbeat { done, thread }
    }

    /// Sends the last heartbeat and ends the thread.
    pub fn stop(mut self) {
        {
            let (lock, cv) = &*self.done;
            if let Ok(mut d) = lock.lock() {
                *d = true;
            }
            cv.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Sender {
    /// One heartbeat; false when the server said the run is over.
    fn beat(&mut self) -> bool {
        let progress = self.counts();
        let Some(client) = &self.client else {
            return true;
        };
        let body = match serde_json::to_vec(&progress) {
            Ok(b) => b,
            Err(_) => return true,
        };
        let res = client
            .post(&self.url)
            .bearer_auth(&self.token)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send();
        match res {
            Ok(r) if r.status().is_success() => true,
            Ok(r) if r.status() == reqwest::StatusCode::GONE => {
                self.control.set_gone();
                false
            }
            Ok(r) => {
                let s = r.status().as_u16().to_string();
                if self.reported.insert(s.clone()) {
                    eprintln!("cella: the server refused a heartbeat (HTTP {s}); retrying");
                }
                true
            }
            Err(e) => {
                let kind = if e.is_timeout() {
                    "timed out".to_string()
                } else {
                    cause(&e.without_url())
                };
                if self.reported.insert(kind.clone()) {
                    eprintln!("cella: a heartbeat failed ({kind}); retrying");
                }
                true
            }
        }
    }

    fn counts(&mut self) -> TaskProgress {
        let mut p = self.last;
        p.steps = self.control.steps();
        if let Some(base) = &self.base_sha {
            let range = format!("{base}..HEAD");
            if let Some(out) = git(&self.workdir, &["rev-list", "--count", &range]) {
                if let Ok(n) = out.trim().parse() {
                    p.commits = n;
                }
            }
            if let Some(out) = git(&self.workdir, &["diff", "--name-only", "-z", base, "--"]) {
                p.files_changed = out
                    .split('\0')
                    .filter(|s| !s.is_empty())
                    .count()
                    .try_into()
                    .unwrap_or(u32::MAX);
            }
        }
        self.last = p;
        p
    }
}

/// Runs a read-only git command in `dir` with a timeout; its stdout, or None.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let mut cmd = Command::new("git");
    cmd.args([
        "-c",
        "core.fsmonitor=false",
        "-c",
        "core.untrackedCache=false",
    ])
    .args(args)
    .current_dir(dir)
    .env("GIT_OPTIONAL_LOCKS", "0")
    .env("GIT_TERMINAL_PROMPT", "0")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    proc::own_group(&mut cmd);
    let mut child = cmd.spawn().ok()?;
    let mut stdout = child.stdout.take()?;
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + GIT_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                proc::signal_group(&child, libc::SIGKILL);
                let _ = child.wait();
                return None;
            }
        }
    };
    let out = reader.join().ok()?;
    if !status.success() {
        return None;
    }
    String::from_utf8(out).ok()
}

/// An error and its causes on one line (reqwest's own message is only the outermost).
fn cause(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}
